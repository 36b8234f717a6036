"""The exact samplers of dpproxy.mechanisms, run on a whole vector of draws at once.

Same algorithms (CKS20 Algorithms 1-3), same distributions: numpy only does integer
arithmetic and comparisons on uniform words from the OS's CSPRNG (`secrets.token_bytes`);
no floating point touches the noise and no numpy generator is used. The steps run in
lockstep over many independent draws, and these facts make the outputs independent with
exactly the scalar samplers' law:

* A rejection loop ("repeat a trial until it is accepted") returns an accepted trial's
  conditional law. Taking an i.i.d. sequence of trials and giving the k-th accepted one
  to the k-th output, drawing more trials until every output has one, yields
  independent outputs with that law (`_below`, `discrete_laplace`, `discrete_gaussian`).
* Cutting an i.i.d. sequence of Bernoulli(exp(-1)) draws at its failures gives i.i.d.
  runs of successes: the geometric count G of CKS20's Algorithm 2, P(G >= w) = exp(-w).
* Bernoulli(exp(-(w + r/D))) with r < D is [G >= w] and an independent
  Bernoulli(exp(-r/D)) (the scalar code draws the w unit factors one by one).
* Von Neumann's round k (CKS20 Algorithm 1) goes on with probability x/k; the scalar code
  draws randbelow(D·k) < r for x = r/D. Here it is Bernoulli(1/k) and an independent
  Bernoulli(x): the same probability. The Bernoulli(1/k) of consecutive rounds are the
  digits of one mixed-radix number (`_first_failed_round`).
* Bernoulli(r/D) for a huge D (the Gaussian's acceptance): with L = ⌊r·2^64/D⌋ and a
  uniform word W, W < L succeeds and W > L fails; W = L (probability 2^-64) is settled by
  an exact Bernoulli((r·2^64 − L·D)/D), which is the rest of the comparison of a uniform
  real in [0, 1) with r/D.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Sequence

import numpy as np

_I64_SAFE = 1 << 62  # int64 sums of two values below this cannot overflow
_MAX_T = 1 << 62  # Laplace t above this: the scalar sampler (outputs could overflow int64)
_MAX_GAUSS_T = 1 << 40  # Gaussian proposals' Laplace scale above this: the scalar sampler


def _words(n: int) -> np.ndarray:
    """n uniform 64-bit words from the OS's CSPRNG."""
    return np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64)


def _uniform_bits(bits: int, n: int) -> np.ndarray:
    """n uniform integers of `bits` bits (1 <= bits <= 64), in the narrowest unsigned type:
    the OS's CSPRNG is the cost, so no byte is drawn that a narrower type would not need."""
    dtype = _DTYPES[(bits - 1) // 8]
    raw = np.frombuffer(secrets.token_bytes(n * dtype.itemsize), dtype=dtype)
    return raw if bits == 8 * dtype.itemsize else raw & dtype.type((1 << bits) - 1)


_DTYPES = [np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.uint32),
           *[np.dtype(np.uint64)] * 4]


def _bits(n: int) -> np.ndarray:
    """n uniform bits (bool) from the OS's CSPRNG."""
    return _below(2, n).astype(bool)


def _concatenate(chunks: list[np.ndarray]) -> np.ndarray:
    if not chunks:
        return np.zeros(0, dtype=np.int64)
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)


def _below(bound: int, n: int) -> np.ndarray:
    """n independent uniform integers in [0, bound), 1 <= bound <= 2^64, unsigned.

    Words of the bit length of bound − 1, those >= bound rejected (as randbelow); or,
    where that would reject more than a quarter of them, words of the whole unsigned type
    holding that bit length, those >= the largest multiple of bound it holds rejected, and
    the rest taken mod bound (uniform on a multiple of bound, so uniform mod it): bound 5
    keeps 255 of 256 bytes instead of 5 of 8."""
    bits = (bound - 1).bit_length()
    if bits == 0:
        return np.zeros(n, dtype=np.uint8)
    if bits == 1:  # bound 2: one bit each
        return np.unpackbits(np.frombuffer(secrets.token_bytes((n + 7) // 8), dtype=np.uint8),
                             count=n)
    if bound == 1 << bits:  # a power of two: nothing to reject
        return _uniform_bits(bits, n)
    dtype = _DTYPES[(bits - 1) // 8]
    whole = 4 * bound < 3 << bits
    width = 8 * dtype.itemsize if whole else bits
    limit = ((1 << width) // bound) * bound if whole else bound
    chunks: list[np.ndarray] = []
    have = 0
    while have < n:
        want = n - have
        # want·2^width/limit draws are expected (< 2·want); the margin makes one pass usual
        w = _uniform_bits(width, (want << width) // limit + 3 * math.isqrt(want) + 8)
        w = w[w < dtype.type(limit)]  # limit < 2^width: bound is not a power of two
        chunks.append(w % dtype.type(bound) if whole else w)
        have += w.size
    return _concatenate(chunks)[:n]


# Von Neumann's loop (CKS20 Algorithm 1) for Bernoulli(exp(-x)), 0 <= x <= 1: round k goes on
# with probability x/k, and the draw succeeds when the first round that stops is odd. Round k
# is split into Bernoulli(1/k) and Bernoulli(x). The Bernoulli(1/k) of rounds 2..5 are the
# mixed-radix digits of one uniform X below 5! (digit k uniform on [0, k), the digits
# independent): they all succeed up to round k exactly when k! divides X. The rare lanes
# (1 in 120) that pass round 5 take rounds 6.._K from a second number, below _K!/5!.
_K = 12
_STAGE = 5
_STAGE_FACTORIAL = math.factorial(_STAGE)  # one byte per lane
_PASSED = np.sum([np.arange(_STAGE_FACTORIAL) % math.factorial(k) == 0
                  for k in range(2, _STAGE + 1)], axis=0).astype(np.int64)


def _first_failed_round(n: int) -> np.ndarray:
    """Per lane, the first round k >= 2 whose Bernoulli(1/k) fails (int64); _K + 1 when
    rounds 2.._K all succeed (the caller goes on from there)."""
    first = _PASSED[_below(_STAGE_FACTORIAL, n)] + 2
    deep = np.flatnonzero(first == _STAGE + 1)
    if deep.size:
        # digits k = _STAGE+1.._K of a second mixed-radix number: all 0 up to k exactly
        # when k!/_STAGE! divides it
        x = _below(math.factorial(_K) // _STAGE_FACTORIAL, deep.size)
        for k in range(_STAGE + 1, _K + 1):
            passed = x % (math.factorial(k) // _STAGE_FACTORIAL) == 0
            deep, x = deep[passed], x[passed]
            if not deep.size:
                break
            first[deep] = k + 1
    return first


def _von_neumann(n: int, bernoulli_x: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """n independent Bernoulli(exp(-x)), 0 <= x <= 1; `bernoulli_x(lanes)` draws a fresh
    Bernoulli(x) for each entry of `lanes` (x may differ between lanes)."""
    if n == 0:
        return np.zeros(0, dtype=bool)
    first = _first_failed_round(n)
    # rounds 1 .. first − 1 pass their Bernoulli(1/k) (round 1's is 1/1); each needs one
    # Bernoulli(x), and the loop stops at the first that fails, else at round `first`
    rounds = first - 1
    lane = np.repeat(np.arange(n), rounds)
    failed = np.flatnonzero(~bernoulli_x(lane))
    stop = first
    if failed.size:
        failed_lane = lane[failed]
        head = np.empty(failed.size, dtype=bool)  # a lane's first failure (lanes ascend)
        head[0] = True
        np.not_equal(failed_lane[1:], failed_lane[:-1], out=head[1:])
        lanes = failed_lane[head]
        start = np.cumsum(rounds)[lanes] - rounds[lanes]  # the lane's round 1 in `lane`
        stop[lanes] = failed[head] - start + 1
    for i in np.flatnonzero(stop == _K + 1):  # rounds 1.._K all went on: continue one by one
        k = _K + 1
        while secrets.randbelow(k) == 0 and bernoulli_x(np.array([i]))[0]:
            k += 1
        stop[i] = k
    return (stop & 1).astype(bool)


def _bern_exp_minus_one(n: int) -> np.ndarray:
    """n independent Bernoulli(exp(-1)): von Neumann's loop with x = 1, which stops at the
    first round whose Bernoulli(1/k) fails."""
    first = _first_failed_round(n)
    for i in np.flatnonzero(first == _K + 1):
        k = _K + 1
        while secrets.randbelow(k) == 0:
            k += 1
        first[i] = k
    return (first & 1).astype(bool)


def _geometric(m: int) -> np.ndarray:
    """m independent counts of Bernoulli(exp(-1)) successes before a failure (int64):
    the runs of successes in one sequence of such draws, cut at its failures."""
    runs: list[np.ndarray] = []
    have = 0
    carry = 0  # successes of the run still open at the end of the previous chunk
    while have < m:
        n = (m - have) * 8 // 5 + 3 * math.isqrt(m - have) + 16  # 1/(1 − e^-1) ≈ 1.58 per run
        fails = np.flatnonzero(~_bern_exp_minus_one(n))
        if fails.size == 0:
            carry += n
            continue
        # fails[i] − fails[i−1] − 1 (fails[-1] read as −1); np.diff(prepend=) costs more
        lengths = np.empty(fails.size, dtype=np.int64)
        lengths[0] = fails[0] + carry
        np.subtract(fails[1:], fails[:-1] + 1, out=lengths[1:])
        carry = n - 1 - int(fails[-1])
        runs.append(lengths)
        have += lengths.size
    return _concatenate(runs)[:m]


def _below_blocks(bounds: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """Consecutive blocks of uniform integers, sizes[j] of them below bounds[j]."""
    return _concatenate([_below(b, n) for b, n in zip(bounds, sizes, strict=True)])


def discrete_laplace(params: Sequence[tuple[int, int, int]]) -> list[np.ndarray]:
    """For each (t, s, m): m independent draws with P(x) ∝ exp(-|x|·s/t) (CKS20 Algorithm
    2), 1 <= t < 2^62, 1 <= s < 2^62; int64, or Python ints (object) in the rare case one
    does not fit. All parameters' trials run in one batch; each takes its own first m
    accepted trials."""
    assert all(1 <= t < _MAX_T and 1 <= s < _MAX_T for t, s, _ in params)

    def trials(todo: list[int], wants: list[int]) -> list[np.ndarray]:
        t = [params[j][0] for j in todo]
        s = [params[j][1] for j in todo]
        sizes = []
        for j, want in zip(todo, wants, strict=True):
            tj, sj, _ = params[j]
            # the share of trials kept (sizes the batch only): E[exp(-U/t)], then the sign
            # step drops half of the zeros, P(Y = 0) = 1 − exp(-s/t)
            kept = (-math.expm1(-1.0) / (tj * -math.expm1(-1 / tj))) \
                * (1 + math.exp(-sj / tj)) / 2
            sizes.append(int(want / kept) + 3 * math.isqrt(want) + 16)
        starts = np.cumsum(sizes) - sizes
        u = _below_blocks(t, sizes)

        def bernoulli_u_over_t(lane: np.ndarray, u: np.ndarray = u, t: list[int] = t,
                               starts: np.ndarray = starts) -> np.ndarray:
            # lanes ascend, so each parameter's lanes are one run of `lane`
            cuts = np.searchsorted(lane, starts)
            return _below_blocks(t, np.diff(cuts, append=lane.size).tolist()) < u[lane]

        accepted = np.flatnonzero(_von_neumann(u.size, bernoulli_u_over_t))
        block = np.searchsorted(starts, accepted, side="right") - 1
        u = u[accepted]
        v = _geometric(u.size)
        negative = _bits(u.size)
        t_lane = np.array(t, dtype=np.int64)[block]
        # the largest v with u + t·v < 2^63 for every u < t
        v_max = np.array([(2**63 - 1) // tj - 1 for tj in t], dtype=np.int64)[block]
        if (v > v_max).any():  # Python ints (probability ~ exp(-2^63/t))
            y = np.array([(int(a) + int(b) * int(c)) // s[k] for a, b, c, k in
                          zip(u, t_lane, v, block, strict=True)], dtype=object)
        else:
            y = u.astype(np.int64) + t_lane * v
            if any(sj != 1 for sj in s):
                y //= np.array(s, dtype=np.int64)[block]
        keep = ~(negative & (y == 0))  # otherwise 0 would be counted twice
        y = np.where(negative, -y, y)[keep]
        block = block[keep]
        return [y[block == k] for k in range(len(todo))]

    return [_concatenate([c.astype(object) for c in cs] if any(c.dtype == object for c in cs)
                         else cs) for cs in _first_accepted([m for _, _, m in params], trials)]


def discrete_laplace_reaching(t: int, s: int, least: np.ndarray
                              ) -> tuple[np.ndarray, np.ndarray]:
    """For each lane j a draw Z_j with P(x) ∝ exp(-|x|·s/t), as `discrete_laplace` gives,
    kept only where Z_j >= least[j] (|least| < 2^62): the kept lanes (ascending) and
    their draws.

    The same law as drawing every Z_j and comparing, with fewer whole draws. Let
    a = exp(-s/t), p = t/gcd(t, s), so that a^p = exp(-s/gcd(t, s)) is a whole power of
    exp(-1). For j >= 0, P(Z >= j) = a^j/(1+a), and Z given Z >= j is j + G with
    P(G = g) = (1−a)·a^g. So for k = least[j] = m + r > 0, m = p·⌊k/p⌋:
    P(Z >= k) = a^m · P(Z' >= r) and Z given Z >= k is m + (Z' given Z' >= r). The lane
    first passes [E >= m·s/t] for a count E of exp(-1) successes (P = e^{-m·s/t} = a^m),
    which few lanes far below their least do, and only then draws a whole Z', kept as
    m + Z' when Z' >= r. Lanes with k <= 0 draw Z and compare, as without this.
    (Partition selection: most candidate groups lie far below the threshold.)"""
    least = np.asarray(least, dtype=np.int64)
    assert least.size == 0 or int(np.abs(least).max()) < _I64_SAFE
    common = math.gcd(t, s)
    period, per_period = t // common, s // common  # a^period = exp(-per_period)
    far = np.flatnonzero(least > 0)
    shift = np.zeros(least.size, dtype=np.int64)  # m per lane
    if far.size:
        periods = least[far] // period
        if int(periods.max()) * per_period >= _I64_SAFE:
            periods[:] = 0  # a count that large is never drawn: leave it to whole draws
        need = periods * per_period
        if need.any():
            far = far[_geometric(far.size) >= need]
            shift[far] = least[far] // period * period
    lanes = np.flatnonzero(least <= 0) if far.size == 0 \
        else np.sort(np.concatenate([np.flatnonzero(least <= 0), far]))
    z = discrete_laplace([(t, s, lanes.size)])[0]
    kept = np.asarray(z >= least[lanes] - shift[lanes], dtype=bool)
    lanes = lanes[kept]
    return lanes, _noisy(shift[lanes], z[kept], 1.0)  # m + Z' (m = 0 below the least)


def laplace_reaching(values: np.ndarray, t: int, s: int, threshold: int
                     ) -> tuple[np.ndarray, np.ndarray] | None:
    """at_least(values + discrete Laplace noise (t, s), threshold) in law, by
    `discrete_laplace_reaching`; None where values or threshold are too large for it."""
    if abs(threshold) >= _I64_SAFE // 2 \
            or (values.size and int(np.abs(values).max()) >= _I64_SAFE // 2):
        return None
    lanes, noise = discrete_laplace_reaching(t, s, threshold - values.astype(np.int64))
    return lanes, _noisy(values[lanes].astype(np.int64), noise, 1.0)


def at_least(noisy: np.ndarray, threshold: int) -> tuple[np.ndarray, np.ndarray]:
    """The indices (ascending) of the values reaching the threshold, and those values."""
    lanes = np.flatnonzero(np.asarray(noisy >= threshold, dtype=bool))
    return lanes, noisy[lanes]


def _first_accepted(wanted: Sequence[int],
                    trials: Callable[[list[int], list[int]], list[np.ndarray]]
                    ) -> list[list[np.ndarray]]:
    """Rounds of `trials(todo, wants)` (each parameter in `todo` still wanting that many
    draws; it returns each one's accepted draws, in order) until parameter j has its
    first wanted[j] accepted draws: per parameter, the chunks that make them up."""
    chunks: list[list[np.ndarray]] = [[] for _ in wanted]
    have = [0] * len(wanted)
    while True:
        todo = [j for j, m in enumerate(wanted) if have[j] < m]
        if not todo:
            return chunks
        wants = [wanted[j] - have[j] for j in todo]
        for j, want, accepted in zip(todo, wants, trials(todo, wants), strict=True):
            mine = accepted[:want]
            chunks[j].append(mine)
            have[j] += mine.size


def _bernoulli_ratio(lo: np.ndarray, rest: list[int], den: list[int], index: np.ndarray
                     ) -> np.ndarray:
    """Bernoulli(r/d) per lane, r = rest[index] < d = den[index] (Python ints) and
    lo = ⌊r·2^64/d⌋ per lane: a uniform word below lo succeeds, above it fails, and a tie
    is settled by the rest of the comparison, Bernoulli((r·2^64 − lo·d)/d)."""
    w = _words(lo.size)
    out = w < lo
    for i in np.flatnonzero(w == lo):
        r, d = rest[index[i]], den[index[i]]
        out[i] = secrets.randbelow(d) < (r << 64) - int(lo[i]) * d
    return out


def _bern_exp_neg_split(whole: np.ndarray, lo: np.ndarray, rest: list[int], den: list[int],
                        index: np.ndarray) -> np.ndarray:
    """Bernoulli(exp(-(w + r/d))) per lane: [G >= w] for a geometric count G, and von
    Neumann's loop for exp(-r/d)."""
    out = np.ones(whole.size, dtype=bool)
    positive = np.flatnonzero(whole > 0)
    if positive.size:
        out[positive] = _geometric(positive.size) >= whole[positive]
    alive = np.flatnonzero(out)
    out[alive] = _von_neumann(alive.size, lambda lane: _bernoulli_ratio(
        lo[alive[lane]], rest, den, index[alive[lane]]))
    return out


def discrete_gaussian(params: Sequence[tuple[int, int, int]]) -> list[np.ndarray]:
    """For each (p, q, m): m independent draws with P(x) ∝ exp(-x²·q/(2p)) (CKS20
    Algorithm 3), σ² = p/q with ⌊σ⌋ < 2^40: discrete Laplace proposals of scale
    t = ⌊σ⌋ + 1, each accepted with probability exp(-(|y|·q·t − p)² / (2·p·q·t²)),
    computed once per distinct |y|; each parameter takes its first m accepted."""
    scales = [math.isqrt(p // q) + 1 for p, q, _ in params]
    assert all(t < _MAX_GAUSS_T for t in scales)

    def trials(todo: list[int], wants: list[int]) -> list[np.ndarray]:
        # acceptance is above 0.45 for any σ (≈ 0.76 for large σ); the margin makes one
        # pass the usual case
        proposals = discrete_laplace([(scales[j], 1, 2 * want + 3 * math.isqrt(want) + 16)
                                      for j, want in zip(todo, wants, strict=True)])
        whole: list[int] = []
        rest: list[int] = []
        den: list[int] = []
        lo: list[int] = []
        lanes = []
        for j, y in zip(todo, proposals, strict=True):
            p, q, _ = params[j]
            t = scales[j]
            d = 2 * p * q * t * t
            values, index = np.unique(np.abs(y), return_inverse=True)
            lanes.append(index.reshape(-1) + len(whole))
            for a in values.tolist():
                whole_part, r = divmod((a * q * t - p) ** 2, d)
                # G is bounded by the draws made, far below 2^62: [G >= w] is unchanged
                whole.append(min(whole_part, _I64_SAFE))
                rest.append(r)
                den.append(d)
                lo.append((r << 64) // d)
        lane = _concatenate(lanes)
        accept = _bern_exp_neg_split(np.array(whole, dtype=np.int64)[lane],
                                     np.array(lo, dtype=np.uint64)[lane], rest, den, lane)
        ends = np.cumsum([y.size for y in proposals]).tolist()
        return [y[accept[end - y.size:end]] for y, end in zip(proposals, ends, strict=True)]

    return [_concatenate(cs) for cs in _first_accepted([m for _, _, m in params], trials)]


def snapped(exact: Sequence[float], gamma: float) -> np.ndarray | None:
    """round(v/γ) for every value, as release() snaps it (int64), or None when that needs
    Python's arithmetic: a value that is not a number numpy holds exactly, a non-finite
    one, or a result that might not leave room to add noise in int64."""
    try:
        values = np.asarray(exact)
    except (OverflowError, ValueError):
        return None
    kind = values.dtype.kind
    if kind in "iub":  # ints (bools too: _snap reads True as 1)
        if values.size and not (values.min() > -_I64_SAFE and values.max() < _I64_SAFE):
            return None
        ints = values.astype(np.int64)
        if gamma == 1.0:
            return ints  # exact, as int(exact)
        values = ints.astype(np.float64)  # as float(exact): to nearest
    elif kind == "f":
        values = values.astype(np.float64)
        # numpy made floats of any ints mixed in: exact below 2^53 (release() keeps ints
        # exact when gamma == 1, and float(v) is the same float)
        if values.size and not (np.abs(values) < 2.0**53).all() \
                and int in set(map(type, exact)):
            return None
    else:
        return None
    with np.errstate(all="ignore"):
        scaled = values / gamma
    if not np.isfinite(scaled).all() or not (np.abs(scaled) < _I64_SAFE).all():
        return None
    return np.rint(scaled).astype(np.int64)  # half to even, as round()


def batch_supported(mechanism: str, n: int, d: int) -> bool:
    """Whether the vector samplers take this grid parameter n/d (else: the scalar ones)."""
    if mechanism == "laplace":
        return n < _MAX_T and d < _MAX_T
    return math.isqrt(n // d) + 1 < _MAX_GAUSS_T


def add_noise(vectors: Sequence[tuple[np.ndarray, str, int, int, float]]
              ) -> list[list[float | int]]:
    """For each (values, mechanism, n, d, γ): values + exact noise with grid parameter n/d,
    then γ·(...) as release() returns it: Python ints when γ == 1, floats otherwise. All
    vectors of one mechanism are noised in one batch."""
    return [noisy.tolist() for noisy in add_noise_arrays(vectors)]


def add_noise_arrays(vectors: Sequence[tuple[np.ndarray, str, int, int, float]]
                     ) -> list[np.ndarray]:
    """add_noise's values as arrays whose tolist() they are: int64 when γ == 1, float64
    otherwise, or an object array of Python ints or floats where int64 would overflow."""
    noise: list[np.ndarray | None] = [None] * len(vectors)
    for mechanism, sampler in (("laplace", discrete_laplace), ("gaussian", discrete_gaussian)):
        mine = [i for i, v in enumerate(vectors) if v[1] == mechanism]
        if mine:
            drawn = sampler([(vectors[i][2], vectors[i][3], vectors[i][0].size) for i in mine])
            for i, z in zip(mine, drawn, strict=True):
                noise[i] = z
    return [_noisy(values, z, gamma) for (values, _, _, _, gamma), z
            in zip(vectors, noise, strict=True)]  # type: ignore[arg-type]


def _noisy(values: np.ndarray, noise: np.ndarray, gamma: float) -> np.ndarray:
    if noise.dtype == object or not (np.abs(noise) < _I64_SAFE).all():
        total = [int(a) + int(b) for a, b in zip(values.tolist(), noise.tolist(), strict=True)]
        return object_array(total if gamma == 1.0 else [float(x) * gamma for x in total])
    result = values + noise
    if gamma == 1.0:
        return result
    # int64 → float64 rounds to nearest like float(int); γ is a power of two
    return result.astype(np.float64) * gamma


def object_array(values: Sequence[object]) -> np.ndarray:
    """A one-dimensional object array holding these very Python objects."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
