"""`dpproxy ldp …`: local DP for survey collectors, and the demo's randomized survey.

* `dpproxy ldp encode` randomizes answers from a CSV on stdin (what a respondent's
  device does, `dpproxy.local`), writing the reports as CSV to stdout;
* `dpproxy ldp estimate` debiases collected reports: estimates with standard errors;
* `dpproxy ldp demo` builds the demo survey (`policies/survey.toml`): the demo's people
  answering two questions under local DP, a table the proxy answers without central
  noise because its reports are already private.

CSV conventions: a header row; the answer column is chosen with --column (default: the
only column). Randomized response reports are 1/0; unary encoding replaces the answer
column by one 1/0 column per domain value, named `column=value`. An empty answer (no
response) stays empty and is not counted.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import duckdb
import numpy as np

from . import errors
from .local import Estimate, RandomizedResponse, UnaryEncoding, parse_yes_no
from .policy import LocalDP, TablePolicy, load_policy

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
MECHANISMS = {"randomized_response": "randomized_response", "rr": "randomized_response",
              "unary": "unary", "oue": "unary"}


# parameters -----------------------------------------------------------------------------------
def channel_from_args(args: argparse.Namespace, domain: list[str] | None) -> LocalDP:
    """The encoder the command-line options describe (the same forms a policy accepts)."""
    try:
        if MECHANISMS[args.mechanism] == "randomized_response":
            if args.epsilon is not None:
                return RandomizedResponse.from_epsilon(args.epsilon)
            if args.f is not None:
                return RandomizedResponse.from_f(args.f)
            if args.h is not None:
                return RandomizedResponse.from_coins(args.h, args.s)
            raise errors.InterfaceError("randomized response needs --epsilon, --f, or --h "
                                        "(with optional --s)")
        if not domain:
            raise errors.InterfaceError("unary encoding needs --domain a,b,c")
        if args.p is not None and args.q is not None:
            return UnaryEncoding(tuple(domain), args.p, args.q)
        if args.epsilon is not None:
            build = UnaryEncoding.symmetric if args.variant == "symmetric" \
                else UnaryEncoding.optimized
            return build(tuple(domain), args.epsilon)
        raise errors.InterfaceError("unary encoding needs --epsilon (with --variant), or "
                                    "--p and --q")
    except ValueError as exc:
        raise errors.InvalidParameterValue(str(exc)) from None


def describe(channel: LocalDP) -> str:
    if isinstance(channel, RandomizedResponse):
        return (f"randomized response: P(yes|yes)={channel.p_one:.6g}, "
                f"P(yes|no)={channel.p_zero:.6g}, ε={channel.epsilon:.6g}")
    return (f"unary encoding over {len(channel.domain)} values: p={channel.p:.6g}, "
            f"q={channel.q:.6g}, ε={channel.epsilon:.6g}")


# CSV ---------------------------------------------------------------------------------------
def _read(stream: TextIO) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(stream)
    if reader.fieldnames is None:
        raise errors.InterfaceError("the input is empty: expected CSV with a header row")
    return list(reader.fieldnames), list(reader)


def _answer_column(header: list[str], column: str | None) -> str:
    if column is not None:
        if column not in header:
            raise errors.InterfaceError(f"no column {column!r} in the input",
                                        hint=f"columns: {', '.join(header)}")
        return column
    if len(header) != 1:
        raise errors.InterfaceError("the input has several columns: choose one with --column",
                                    hint=f"columns: {', '.join(header)}")
    return header[0]


def encode_csv(channel: LocalDP, source: TextIO, target: TextIO, column: str | None) -> int:
    """Randomize one column of a CSV; other columns pass through. Returns the rows written."""
    header, rows = _read(source)
    name = _answer_column(header, column)
    answered = [i for i, row in enumerate(rows) if (row.get(name) or "").strip()]
    answers = [rows[i][name].strip() for i in answered]
    if isinstance(channel, RandomizedResponse):
        try:
            reports = channel.encode(parse_yes_no(answers)).reshape(-1, 1)
        except ValueError as exc:
            raise errors.InvalidTextRepresentation(str(exc)) from None
        out_columns = [name]
    else:
        codes = channel.codes(answers)
        if (codes < 0).any():
            bad = answers[int(np.flatnonzero(codes < 0)[0])]
            raise errors.InvalidTextRepresentation(
                f"answer {bad!r} is not in the domain",
                hint=f"domain: {', '.join(map(str, channel.domain))}")
        reports = channel.encode_codes(codes)
        out_columns = [f"{name}={value}" for value in channel.domain]
    at = header.index(name)
    writer = csv.writer(target, lineterminator="\n")
    writer.writerow(header[:at] + out_columns + header[at + 1:])
    report_of = dict(zip(answered, reports.astype(np.uint8).tolist(), strict=True))
    for i, row in enumerate(rows):
        bits = report_of.get(i)
        cells = [str(b) for b in bits] if bits is not None else [""] * len(out_columns)
        writer.writerow([row[h] for h in header[:at]] + cells
                        + [row[h] for h in header[at + 1:]])
    return len(rows)


def estimate_csv(channel: LocalDP, source: TextIO, column: str | None
                 ) -> list[tuple[str, Estimate, Estimate]]:
    """Per reported value: (label, estimated proportion, estimated count)."""
    header, rows = _read(source)
    if isinstance(channel, RandomizedResponse):
        name = _answer_column(header, column)
        cells = [(row.get(name) or "").strip() for row in rows]
        try:
            bits = parse_yes_no([c for c in cells if c])
        except ValueError as exc:
            raise errors.InvalidTextRepresentation(str(exc)) from None
        share = channel.estimate(bits)
        n = share.n
        return [("yes", share, Estimate(share.value * n, share.standard_error * n, n))]
    if column is None:
        prefixes = {h.split("=", 1)[0] for h in header if "=" in h}
        if len(prefixes) != 1:
            raise errors.InterfaceError("choose the reported column with --column")
        column = prefixes.pop()
    names = [f"{column}={value}" for value in channel.domain]
    missing = [n for n in names if n not in header]
    if missing:
        raise errors.InterfaceError(f"missing report columns: {', '.join(missing)}")
    reported = [[(row.get(n) or "").strip() for n in names] for row in rows]
    complete = [r for r in reported if all(r)]
    try:
        bits = np.array([parse_yes_no(r) for r in complete], dtype=bool).reshape(-1, len(names))
    except ValueError as exc:
        raise errors.InvalidTextRepresentation(str(exc)) from None
    counts = channel.estimate(bits)
    n = bits.shape[0]
    return [(str(value), Estimate(c.value / n if n else math.nan,
                                  c.standard_error / n if n else math.inf, n), c)
            for value, c in zip(channel.domain, counts, strict=True)]


# demo ----------------------------------------------------------------------------------------
SURVEY_SCHEMA = """
CREATE TABLE survey (
    person_id INTEGER PRIMARY KEY,
    sex VARCHAR NOT NULL,
    age INTEGER NOT NULL,
    -- every person reports (NOT NULL): public membership releases the reports exactly
    high_income BOOLEAN NOT NULL,   -- randomized response to "is your income above 50K?"
    occupation BOOLEAN[] NOT NULL   -- unary encoding of occupation, one bit per domain value
);
COMMENT ON TABLE survey IS 'Demo survey answered under local DP (dpproxy ldp demo)';
"""


def build_survey(source: Path, target: Path, table: TablePolicy,
                 progress: Callable[[str], None] | None = None) -> Path:
    """Write the `survey` table at `target`: every person of the demo's `adult` table (at
    `source`) answers two questions on their device, with the encoders `table` declares.

    The truth never reaches the file: only randomized reports are written. A person without
    an occupation reports the all-zero vector, randomized like any other answer.
    """
    say = progress or (lambda _message: None)
    income = table.columns["high_income"].ldp
    occupation = table.columns["occupation"].ldp
    if not isinstance(income, RandomizedResponse) or not isinstance(occupation, UnaryEncoding):
        raise errors.InvalidPolicy("the survey policy must declare high_income as "
                                   "randomized_response and occupation as unary")
    con = duckdb.connect(str(source), read_only=True)
    try:
        rows = con.execute("SELECT person_id, sex, age, income = '>50K', occupation "
                           "FROM adult ORDER BY person_id").fetchall()
    finally:
        con.close()
    person, sex, age, rich, job = (list(c) for c in zip(*rows, strict=True))
    say(f"randomizing {len(person):,} answers on their devices: {describe(income)}; "
        f"{describe(occupation)}")
    columns: dict[str, np.ndarray] = {
        "person_id": np.asarray(person, dtype=np.int32),
        "sex": np.asarray(sex, dtype=object),
        "age": np.asarray(age, dtype=np.int32),
        "high_income": income.encode(np.asarray(rich, dtype=bool)),
    }
    bits = occupation.encode(job)
    for i in range(bits.shape[1]):
        columns[f"b{i}"] = bits[:, i]
    target.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tmp = workdir / target.name
        out = duckdb.connect(str(tmp))
        try:
            out.execute(SURVEY_SCHEMA)
            out.register("survey_src", columns)
            listed = ", ".join(f"b{i}" for i in range(bits.shape[1]))
            out.execute(f"INSERT INTO survey SELECT person_id, sex, age, high_income, "
                        f"[{listed}] FROM survey_src ORDER BY person_id")
            out.unregister("survey_src")
            out.execute("CHECKPOINT")
        finally:
            out.close()
        Path(f"{target}.wal").unlink(missing_ok=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    say(f"wrote {target}")
    return target


def default_survey_policy() -> Path:
    here = Path("policies/survey.toml")
    return here if here.exists() else PACKAGE_ROOT / "policies" / "survey.toml"


# commands ------------------------------------------------------------------------------------
def _domain(args: argparse.Namespace) -> list[str] | None:
    return [v.strip() for v in args.domain.split(",")] if args.domain else None


def cmd_encode(args: argparse.Namespace) -> int:
    channel = channel_from_args(args, _domain(args))
    print(f"ldp: {describe(channel)}", file=sys.stderr)
    encode_csv(channel, sys.stdin, sys.stdout, args.column)
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    channel = channel_from_args(args, _domain(args))
    results = estimate_csv(channel, sys.stdin, args.column)
    if args.json:
        print(json.dumps({"mechanism": describe(channel), "confidence": args.confidence,
                          "estimates": [_estimate_json(label, share, count, args.confidence)
                                        for label, share, count in results]}, indent=2))
        return 0
    print(describe(channel))
    print(f"reports: {results[0][1].n if results else 0}; intervals at "
          f"{args.confidence:.0%} (normal approximation)")
    lines = [("value", "proportion", "± 2·SE", "count", "± 2·SE", "count interval")]
    for label, share, count in results:
        low, high = count.interval(args.confidence)
        lines.append((label, f"{share.value:.4f}", f"{share.delta:.4f}", f"{count.value:.1f}",
                      f"{count.delta:.1f}", f"[{low:.1f}, {high:.1f}]"))
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    for row in lines:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return 0


def _estimate_json(label: str, share: Estimate, count: Estimate, confidence: float
                   ) -> dict[str, Any]:
    return {"value": label, "n": share.n, "proportion": share.value,
            "proportion_standard_error": share.standard_error, "count": count.value,
            "count_standard_error": count.standard_error,
            "count_interval": list(count.interval(confidence)),
            "proportion_interval": list(share.interval(confidence))}


def cmd_demo(args: argparse.Namespace) -> int:
    from .cli import default_policy
    from .demo import DEFAULT_SEED, ensure_demo

    policy = load_policy(args.policy)
    if "survey" not in policy.tables or policy.backend.path is None:
        raise errors.InvalidPolicy(f"{args.policy} has no survey table on a DuckDB file")
    source, seed = args.source, DEFAULT_SEED
    if source is None:  # the demo policy's database, built from its seed if missing
        demo = load_policy(default_policy())
        assert demo.backend.path is not None
        source, seed = demo.backend.path, demo.backend.demo_seed or DEFAULT_SEED

    def say(message: str) -> None:
        print(f"ldp demo: {message}", file=sys.stderr)

    ensure_demo(source, seed=seed, progress=say)
    build_survey(Path(source), policy.backend.path, policy.tables["survey"], say)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `ldp encode | estimate | demo` to the dpproxy command."""
    ldp = sub.add_parser("ldp", help="local DP: randomize answers, estimate from reports, demo")
    lsub = ldp.add_subparsers(dest="ldp_command", required=True, metavar="ACTION")

    def channel_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--mechanism", required=True, choices=sorted(MECHANISMS),
                       help="randomized_response (rr) for yes/no, unary (oue) for a domain")
        p.add_argument("--epsilon", type=float, help="local ε")
        p.add_argument("--f", type=float, help="randomized response: P(yes | yes)")
        p.add_argument("--h", type=float, help="randomized response: P(first coin says "
                                               "'use the second coin')")
        p.add_argument("--s", type=float, default=0.5,
                       help="randomized response: P(second coin says yes) (default 0.5)")
        p.add_argument("--domain", help="unary: the values, comma-separated, in order")
        p.add_argument("--variant", choices=("optimized", "symmetric"), default="optimized",
                       help="unary with --epsilon: OUE (default) or symmetric")
        p.add_argument("--p", type=float, help="unary: P(report 1 | bit 1)")
        p.add_argument("--q", type=float, help="unary: P(report 1 | bit 0)")
        p.add_argument("--column", help="the answer column (default: the only one)")

    enc = lsub.add_parser("encode", help="randomize answers: CSV on stdin, reports on stdout")
    channel_args(enc)
    enc.set_defaults(func=cmd_encode)
    est = lsub.add_parser("estimate", help="debias reports (CSV on stdin): estimates and "
                                           "standard errors")
    channel_args(est)
    est.add_argument("--confidence", type=float, default=0.95)
    est.add_argument("--json", action="store_true", help="print JSON")
    est.set_defaults(func=cmd_estimate)
    demo = lsub.add_parser("demo", help="build the demo survey table answered under local DP")
    demo.add_argument("--policy", type=Path, default=default_survey_policy(),
                      help="the survey policy (default: policies/survey.toml)")
    demo.add_argument("--source", type=Path,
                      help="the demo database to survey (default: the demo policy's)")
    demo.set_defaults(func=cmd_demo)
