"""Window functions over a grouped query's released rows: post-processing, as SQL runs them.

`SELECT occupation, COUNT(*) * 100.0 / SUM(COUNT(*)) OVER () FROM adult GROUP BY
occupation` (percent of total), `RANK() OVER (ORDER BY COUNT(*) DESC)`, running totals
and moving averages. PostgreSQL computes window functions after GROUP BY and HAVING, over
the query's groups. Here each group's aggregates are released (noisy) values and its keys
are public or passed partition selection, so a window function only reads what the query
releases anyway: post-processing, which costs no budget and protects as much as the
release itself. Windows over a table's rows (no aggregate) would read raw rows and are
refused by the analyzer.

The analyzer replaces each window call in the select list and ORDER BY with a
`WindowRef` (`extract`) and describes it as a `WindowCall` over post-processing
expressions (`describe`); the release step evaluates every call over the rows HAVING
kept, before ORDER BY and LIMIT (`compute`), and outputs read the values as they read
aggregates.

Supported: SUM, AVG, COUNT, MIN, MAX, ROW_NUMBER, RANK, DENSE_RANK, PERCENT_RANK,
CUME_DIST, NTILE, LAG, LEAD, FIRST_VALUE, LAST_VALUE and NTH_VALUE, with PARTITION BY,
ORDER BY and a frame of ROWS (UNBOUNDED, n PRECEDING/FOLLOWING, CURRENT ROW) or RANGE
(UNBOUNDED, CURRENT ROW). Semantics are PostgreSQL's: the default frame runs from the
partition's start to the current row's last peer (the whole partition without ORDER BY);
SUM and AVG of integers are exact decimals there, floats here (as dpproxy sends NUMERIC).

>>> from sqlglot import parse_one
>>> select, found = extract(parse_one("SELECT k, SUM(COUNT(*)) OVER () FROM t GROUP BY k"))
>>> select.expressions[1]
WindowRef(this=__window0, function=sum)
>>> [w.sql("postgres") for w in found]
['SUM(COUNT(*)) OVER ()']
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from .errors import (
    DatatypeMismatch,
    GroupingError,
    InvalidFrameOffset,
    InvalidNthValueArgument,
    InvalidNtileArgument,
    NotSupportedError,
    WindowingError,
)
from .postprocess import OrderItem, Value, WindowRef, compare_values, evaluate

# SQL name → sqlglot node of each supported window function
FUNCTIONS: dict[str, type[exp.Expression]] = {
    "sum": exp.Sum, "avg": exp.Avg, "count": exp.Count, "min": exp.Min, "max": exp.Max,
    "row_number": exp.RowNumber, "rank": exp.Rank, "dense_rank": exp.DenseRank,
    "percent_rank": exp.PercentRank, "cume_dist": exp.CumeDist, "ntile": exp.Ntile,
    "lag": exp.Lag, "lead": exp.Lead, "first_value": exp.FirstValue,
    "last_value": exp.LastValue, "nth_value": exp.NthValue,
}
_NAMES = {node: name for name, node in FUNCTIONS.items()}
HELP = ", ".join(name.upper() for name in FUNCTIONS)

UNBOUNDED_PRECEDING = "unbounded preceding"
PRECEDING = "preceding"
CURRENT_ROW = "current row"
FOLLOWING = "following"
UNBOUNDED_FOLLOWING = "unbounded following"


@dataclass(frozen=True)
class FrameBound:
    kind: str  # one of the five names above
    offset: int = 0  # rows, for PRECEDING and FOLLOWING


@dataclass(frozen=True)
class Frame:
    rows: bool  # ROWS: CURRENT ROW is the row itself; RANGE: also its peers
    start: FrameBound
    end: FrameBound


# PostgreSQL's default: RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
DEFAULT_FRAME = Frame(False, FrameBound(UNBOUNDED_PRECEDING), FrameBound(CURRENT_ROW))


@dataclass(frozen=True)
class WindowCall:
    """One window function call; outputs read its value under `name`."""

    name: str
    function: str  # the SQL name, lower case (a key of FUNCTIONS)
    arguments: tuple[exp.Expression, ...]  # post-processing expressions; COUNT(*): none
    partition: tuple[exp.Expression, ...]
    order: tuple[OrderItem, ...]
    frame: Frame
    offset: int = 1  # LAG/LEAD's offset, NTILE's buckets, NTH_VALUE's position
    text: str = ""  # the call as written (normalized), for messages and EXPLAIN


def extract(select: exp.Select) -> tuple[exp.Select, list[exp.Window]]:
    """The query with each window call of its select list and ORDER BY replaced by a
    `WindowRef` (`__window<i>`), and the calls (detached copies), in that order. Raises
    where SQL allows no window function (WHERE, GROUP BY, HAVING, inside an aggregate or
    another window) or dpproxy reads none (a named window, FILTER on it)."""
    if select.find(exp.Window) is None:
        return select, []
    for clause, where in (("where", "WHERE"), ("group", "GROUP BY"), ("having", "HAVING")):
        node = select.args.get(clause)
        if node is not None and node.find(exp.Window) is not None:
            raise WindowingError(f"window functions are not allowed in {where}",
                                 hint="filter groups with HAVING on aggregates, or compute "
                                      "the window in the select list")
    for window in select.find_all(exp.Window):
        if window.find_ancestor(exp.Window) is not None:
            raise WindowingError("window function calls cannot be nested")
        outer = window.find_ancestor(exp.AggFunc)
        if outer is not None and not isinstance(outer.parent, exp.Window):
            raise GroupingError("aggregate function calls cannot contain window function "
                                "calls", hint="apply the window to the aggregate: "
                                              "SUM(COUNT(*)) OVER ()")
    found: list[exp.Window] = []

    def swap(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Window):
            return node
        function = node.this
        if isinstance(function, exp.Identifier) or node.args.get("alias") is not None:
            raise NotSupportedError("named windows (OVER name, WINDOW …) are not supported",
                                    hint="write the window in place: OVER (PARTITION BY … "
                                         "ORDER BY …)")
        found.append(node.copy())
        return WindowRef(this=f"__window{len(found) - 1}", function=_function_name(function))

    out = select.copy()
    out.set("expressions", [e.transform(swap) for e in out.expressions])
    if out.args.get("order") is not None:
        out.set("order", out.args["order"].transform(swap))
    return out, found


def _function_name(function: exp.Expression) -> str:
    name = _NAMES.get(type(function))
    if name is None:
        what = function.sql_name() if isinstance(function, exp.Func) else function.sql("postgres")
        raise NotSupportedError(f"{what} is not supported as a window function",
                                hint=f"supported: {HELP}")
    return name


def describe(window: exp.Window, name: str,
             prepare: Callable[[exp.Expression], exp.Expression]) -> WindowCall:
    """The WindowCall of one extracted window; `prepare` checks a post-processing
    expression (arguments, PARTITION BY, ORDER BY) and returns it as outputs read it."""
    function = window.this
    sql_name = _function_name(function)
    arguments: list[exp.Expression] = []
    offset = 1
    if sql_name == "count" and isinstance(function.this, exp.Star):
        pass  # COUNT(*): the rows of the frame
    elif sql_name in ("row_number", "rank", "dense_rank", "percent_rank", "cume_dist"):
        if function.expressions or function.this is not None:
            raise NotSupportedError(f"{sql_name.upper()}() takes no arguments here",
                                    hint=f"rank by ORDER BY inside OVER: {sql_name.upper()}() "
                                         "OVER (ORDER BY …)")
    elif sql_name == "ntile":
        offset = _positive_constant(function.this, InvalidNtileArgument,
                                    "argument of ntile must be greater than zero")
    else:
        if isinstance(function.this, exp.Distinct) or function.args.get("expressions"):
            raise NotSupportedError(f"{function.sql('postgres')} is not supported as a window "
                                    "function", hint=f"one argument; supported: {HELP}")
        arguments.append(prepare(function.this))
        if sql_name in ("lag", "lead"):
            if function.args.get("offset") is not None:
                offset = _integer_constant(function.args["offset"], f"{sql_name.upper()}'s "
                                           "offset")
            if function.args.get("default") is not None:
                arguments.append(prepare(function.args["default"]))
        elif sql_name == "nth_value":
            offset = _positive_constant(function.args.get("offset"), InvalidNthValueArgument,
                                        "argument of nth_value must be greater than zero")
    partition = tuple(prepare(p) for p in window.args.get("partition_by") or ())
    order_node = window.args.get("order")
    order = tuple(
        OrderItem(prepare(o.this), bool(o.args.get("desc")),
                    bool(o.args["nulls_first"]) if o.args.get("nulls_first") is not None
                    else bool(o.args.get("desc")))
        for o in (order_node.expressions if order_node is not None else ()))
    return WindowCall(name, sql_name, tuple(arguments), partition, order,
                      _frame(window.args.get("spec")), offset, window.sql("postgres"))


def parts(window: exp.Window) -> list[exp.Expression]:
    """Detached copies of the expressions a window call reads (its arguments, PARTITION BY
    and ORDER BY), where the aggregates it reads are found."""
    function = window.this
    nodes = [function.this if isinstance(function.this, exp.Expression) else None,
             function.args.get("default"), *(window.args.get("partition_by") or ()),
             *(o.this for o in (window.args["order"].expressions
                                if window.args.get("order") is not None else ()))]
    return [n.copy() for n in nodes if n is not None and not isinstance(n, exp.Star)]


def _integer_constant(node: exp.Expression | None, what: str) -> int:
    sign = 1
    while isinstance(node, exp.Paren | exp.Neg):
        sign = -sign if isinstance(node, exp.Neg) else sign
        node = node.this
    if not isinstance(node, exp.Literal) or node.is_string or not node.this.isdigit():
        raise NotSupportedError(f"{what} must be an integer constant",
                                hint="write a number, e.g. 1")
    return sign * int(node.this)


def _positive_constant(node: exp.Expression | None, error: type[Exception],
                       message: str) -> int:
    value = _integer_constant(node, "the argument")
    if value <= 0:
        raise error(message)
    return value


def _frame(spec: exp.WindowSpec | None) -> Frame:
    if spec is None:
        return DEFAULT_FRAME
    if spec.args.get("exclude") is not None:
        raise NotSupportedError("EXCLUDE in a window frame is not supported",
                                hint="use a frame without EXCLUDE")
    kind = str(spec.args.get("kind") or "").upper()
    if kind not in ("ROWS", "RANGE"):
        raise NotSupportedError(f"{kind or 'this'} window frame is not supported",
                                hint="use ROWS or RANGE")
    start = _bound(spec.args.get("start"), spec.args.get("start_side"), kind)
    end = _bound(spec.args.get("end"), spec.args.get("end_side"), kind) \
        if spec.args.get("end") is not None else FrameBound(CURRENT_ROW)
    # PostgreSQL's own checks, with its messages
    if start.kind == UNBOUNDED_FOLLOWING:
        raise WindowingError("frame start cannot be UNBOUNDED FOLLOWING")
    if end.kind == UNBOUNDED_PRECEDING:
        raise WindowingError("frame end cannot be UNBOUNDED PRECEDING")
    if start.kind == CURRENT_ROW and end.kind == PRECEDING:
        raise WindowingError("frame starting from current row cannot have preceding rows")
    if start.kind == FOLLOWING and end.kind in (PRECEDING, CURRENT_ROW):
        raise WindowingError("frame starting from following row cannot have preceding rows")
    return Frame(kind == "ROWS", start, end)


def _bound(value: object, side: object, kind: str) -> FrameBound:
    side_text = str(side or "").upper()
    if isinstance(value, str):
        text = value.upper()
        if text == "CURRENT ROW":
            return FrameBound(CURRENT_ROW)
        if text == "UNBOUNDED":
            return FrameBound(UNBOUNDED_FOLLOWING if side_text == "FOLLOWING"
                              else UNBOUNDED_PRECEDING)
    if kind == "RANGE":
        raise NotSupportedError("RANGE with an offset is not supported",
                                hint="use ROWS BETWEEN n PRECEDING AND CURRENT ROW")
    assert isinstance(value, exp.Expression)
    offset = _integer_constant(value, "a frame offset")
    if offset < 0:
        raise InvalidFrameOffset("frame starting or ending offset must not be negative")
    return FrameBound(FOLLOWING if side_text == "FOLLOWING" else PRECEDING, offset)


def result_type(call: WindowCall, argument_types: Sequence[str]) -> str:
    """The PostgreSQL type name of a call's values, given its arguments' types; SUM and
    AVG of anything but numbers are refused, as in PostgreSQL (which has no sum(text))."""
    if call.function in ("sum", "avg") and argument_types[0] not in ("int8", "float8"):
        raise DatatypeMismatch(f"function {call.function}({argument_types[0]}) does not "
                               "exist as a window function", hint="sum or average numbers")
    if call.function in ("count", "row_number", "rank", "dense_rank", "ntile"):
        return "int8"
    # SUM of integers is NUMERIC in PostgreSQL: fractions survive a division by it
    if call.function in ("percent_rank", "cume_dist", "avg", "sum"):
        return "float8"
    return argument_types[0]


def compute(calls: Sequence[WindowCall], selected: Sequence[int],
            rows: list[dict[str, Value]], keys: list[dict[str, Value]]) -> None:
    """Each call's value on each selected row, stored in rows[i][call.name]."""
    for call in calls:
        partitions: dict[tuple[object, ...], list[int]] = {}
        for i in selected:
            part = tuple(_partition_key(evaluate(e, rows[i], keys[i])) for e in call.partition)
            partitions.setdefault(part, []).append(i)
        for members in partitions.values():
            _compute_partition(call, members, rows, keys)


def _partition_key(value: Value) -> object:
    # NaN equals NaN when SQL groups rows (and -0.0 equals 0.0, as in Python)
    return _NAN if isinstance(value, float) and math.isnan(value) else value


_NAN = ("NaN",)


def _compute_partition(call: WindowCall, members: list[int], rows: list[dict[str, Value]],
                       keys: list[dict[str, Value]]) -> None:
    order = [[evaluate(o.expression, rows[i], keys[i]) for o in call.order] for i in members]

    def compare(a: int, b: int) -> int:
        for item, va, vb in zip(call.order, order[a], order[b], strict=True):
            result = compare_values(va, vb, item.descending, item.nulls_first)
            if result:
                return result
        return a - b  # stable: peers keep the release's order

    sequence = sorted(range(len(members)), key=functools.cmp_to_key(compare))
    rows_in_order = [members[j] for j in sequence]
    n = len(rows_in_order)
    # peer groups: rows equal on every ORDER BY value (all rows, without ORDER BY)
    peer_start = [0] * n
    peer_end = [0] * n
    start = 0
    for j in range(1, n + 1):
        if j == n or any(compare_values(a, b, False, False) != 0 for a, b in
                         zip(order[sequence[j - 1]], order[sequence[j]], strict=True)):
            for k in range(start, j):
                peer_start[k], peer_end[k] = start, j - 1
            start = j
    name = call.name
    values = _function_values(call, rows_in_order, rows, keys, peer_start, peer_end)
    for i, value in zip(rows_in_order, values, strict=True):
        rows[i][name] = value


def _function_values(call: WindowCall, members: list[int], rows: list[dict[str, Value]],
                     keys: list[dict[str, Value]], peer_start: list[int], peer_end: list[int]
                     ) -> list[Value]:
    n = len(members)
    f = call.function
    if f == "row_number":
        return list(range(1, n + 1))
    if f == "rank":
        return [s + 1 for s in peer_start]
    if f == "dense_rank":
        out, rank = [], 0
        for j in range(n):
            rank += peer_start[j] == j
            out.append(rank)
        return out
    if f == "percent_rank":
        return [s / (n - 1) if n > 1 else 0.0 for s in peer_start]
    if f == "cume_dist":
        return [(e + 1) / n for e in peer_end]
    if f == "ntile":
        return _ntile(n, call.offset)
    argument = [evaluate(call.arguments[0], rows[i], keys[i]) for i in members] \
        if call.arguments else [1] * n
    if f in ("lag", "lead"):
        step = -call.offset if f == "lag" else call.offset
        default = [evaluate(call.arguments[1], rows[i], keys[i]) for i in members] \
            if len(call.arguments) > 1 else [None] * n
        return [argument[j + step] if 0 <= j + step < n else default[j] for j in range(n)]
    frames = [_frame_of(call.frame, j, n, peer_start, peer_end) for j in range(n)]
    if f == "first_value":
        return [argument[lo] if lo <= hi else None for lo, hi in frames]
    if f == "last_value":
        return [argument[hi] if lo <= hi else None for lo, hi in frames]
    if f == "nth_value":
        return [argument[lo + call.offset - 1] if lo + call.offset - 1 <= hi else None
                for lo, hi in frames]
    if f == "count" and not call.arguments:
        return [max(hi - lo + 1, 0) for lo, hi in frames]
    if f in ("min", "max"):
        return _extremes(argument, frames, f == "max")
    return _sums(f, argument, frames)


def _frame_of(frame: Frame, j: int, n: int, peer_start: list[int], peer_end: list[int]
              ) -> tuple[int, int]:
    """Row positions [lo, hi] of row j's frame in its partition (lo > hi: empty)."""
    def position(bound: FrameBound, at_start: bool) -> int:
        if bound.kind == UNBOUNDED_PRECEDING:
            return 0
        if bound.kind == UNBOUNDED_FOLLOWING:
            return n - 1
        if bound.kind == CURRENT_ROW:
            if frame.rows:
                return j
            return peer_start[j] if at_start else peer_end[j]
        return j - bound.offset if bound.kind == PRECEDING else j + bound.offset
    lo, hi = max(position(frame.start, True), 0), min(position(frame.end, False), n - 1)
    return lo, hi


def _ntile(n: int, buckets: int) -> list[Value]:
    """PostgreSQL's NTILE: the first n mod buckets buckets hold one row more."""
    size, extra = divmod(n, buckets)
    out: list[Value] = []
    for bucket in range(1, min(buckets, n) + 1):  # buckets beyond the rows stay empty
        out.extend([bucket] * (size + (1 if bucket <= extra else 0)))
    return out[:n]


def _sums(function: str, values: list[Value], frames: list[tuple[int, int]]) -> list[Value]:
    """SUM, AVG or COUNT(x) over each frame, NULLs skipped: by prefix sums (integers add
    exactly, floats to within rounding), or frame by frame where an infinity or NaN would
    spread through the prefix sums to frames without it."""
    # COUNT(x) counts values of any type: it adds nothing up
    numbers = [0 if v is None or function == "count" else v for v in values]
    if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
        sums = [sum(numbers[lo:hi + 1]) for lo, hi in frames]  # type: ignore[arg-type]
    else:
        prefix = list(itertools.accumulate(numbers, initial=0))  # type: ignore[arg-type]
        sums = [prefix[hi + 1] - prefix[lo] if lo <= hi else 0 for lo, hi in frames]
    counts = list(itertools.accumulate((v is not None for v in values), initial=0))
    out: list[Value] = []
    for (lo, hi), total in zip(frames, sums, strict=True):
        k = counts[hi + 1] - counts[lo] if lo <= hi else 0
        if function == "count":
            out.append(k)
        elif k == 0:
            out.append(None)
        else:  # SUM of integers is NUMERIC: a float here, so a division by it keeps fractions
            try:
                out.append(total / k if function == "avg" else float(total))
            except OverflowError:  # an integer beyond a float's range: post-processing NULL
                out.append(None)
    return out


def _extremes(values: list[Value], frames: list[tuple[int, int]], largest: bool
              ) -> list[Value]:
    """MIN or MAX over each frame, NULLs skipped: a monotonic queue, as both ends of the
    frames only move forward."""
    window: deque[int] = deque()
    out: list[Value] = []
    added = 0

    def beats(a: Value, b: Value) -> bool:
        result = compare_values(a, b, False, False)
        return result >= 0 if largest else result <= 0

    for lo, hi in frames:
        while added <= hi:
            if values[added] is not None:
                while window and beats(values[added], values[window[-1]]):
                    window.pop()
                window.append(added)
            added += 1
        while window and window[0] < lo:
            window.popleft()
        out.append(values[window[0]] if window and lo <= hi else None)
    return out

