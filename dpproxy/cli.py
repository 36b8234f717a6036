"""The `dpproxy` command: query, explain, budget, policy check, demo."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import errors
from .accountant import Ledger
from .policy import Policy, check_policy, load_policy
from .session import Engine, Result, open_ledger

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def default_policy() -> Path:
    """policies/demo.toml in the current folder, else the one beside the package."""
    here = Path("policies/demo.toml")
    return here if here.exists() else PACKAGE_ROOT / "policies" / "demo.toml"


def _default_analyst(policy: Policy) -> str:
    analysts = [a.name for a in policy.analysts.values() if a.role != "admin" and a.tables]
    if len(analysts) != 1:
        raise errors.InterfaceError(
            "this policy has several analysts: choose one with --analyst",
            hint=f"analysts: {', '.join(sorted(policy.analysts))}")
    return analysts[0]


# output -------------------------------------------------------------------------------------
def _format_value(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) and abs(value) < 1e15 else repr(value)
    return str(value)


def _format_cell(value: Any, interval: tuple[float, float] | None, half: float | None) -> str:
    text = _format_value(value)
    if half is not None:
        return f"{text} ± {half:.4g}"
    if interval is not None:
        return f"{text} [{interval[0]:.4g}, {interval[1]:.4g}]"
    return text


def format_table(result: Result) -> str:
    """A plain-text table; noisy cells carry ± half-width or their interval."""
    if not result.columns:
        return result.tag
    halves = [a.half_width if a is not None else None for a in result.accuracy] \
        or [None] * len(result.columns)
    cells = [[_format_cell(v, (iv[i] if iv else None), halves[i] if i < len(halves) else None)
              for i, v in enumerate(row)]
             for row, iv in zip(result.rows, result.intervals or [()] * len(result.rows),
                                strict=False)]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(result.columns)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(result.columns, widths, strict=True)),
             "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.append(f"({len(result.rows)} row{'s' if len(result.rows) != 1 else ''})")
    return "\n".join(lines)


def _result_json(result: Result) -> dict[str, Any]:
    return {
        "columns": list(result.columns),
        "rows": [list(r) for r in result.rows],
        "intervals": [[list(i) if i else None for i in row] for row in result.intervals],
        "accuracy": [a.__dict__ if a else None for a in result.accuracy],
        "cost": result.cost.__dict__ if result.cost else None,
        "remaining": result.remaining.__dict__ if result.remaining else None,
    }


# commands -----------------------------------------------------------------------------------
def _open(args: argparse.Namespace) -> tuple[Engine, str]:
    policy = load_policy(args.policy)
    if policy.backend.demo_seed is not None and policy.backend.path is not None \
            and not policy.backend.path.exists():
        _build_demo(policy.backend.path, policy.backend.demo_seed)
    engine = Engine(policy)
    return engine, args.analyst or _default_analyst(policy)


def _session_options(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in (("epsilon", args.epsilon), ("delta", args.delta),
                              ("mechanism", args.mechanism), ("split", args.split))
            if v is not None}


def cmd_query(args: argparse.Namespace) -> int:
    engine, analyst = _open(args)
    with engine:
        result = engine.session(analyst, **_session_options(args)).execute(args.sql)
    if args.json:
        print(json.dumps(_result_json(result), default=str, indent=2))
        return 0
    print(format_table(result))
    if result.cost is not None:
        print(f"cost: ε={result.cost.epsilon:g}, δ={result.cost.delta:g}")
    if result.remaining is not None:
        print(f"budget left for {analyst}: ε={result.remaining.epsilon:.6g}, "
              f"δ={result.remaining.delta:.3g}")
    for accuracy in result.accuracy:
        if accuracy is not None:
            print(f"  {accuracy.describe()}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    engine, analyst = _open(args)
    with engine:
        result = engine.session(analyst, **_session_options(args)).execute(
            f"EXPLAIN {args.sql}")
    print("\n".join(str(row[0]) for row in result.rows))
    return 0


def _account(policy: Policy, analyst: str | None, table: str | None,
             ledger: Ledger) -> str:
    """The account an admin command names: an analyst's, or a table's total budget; an
    analyst removed from the policy whose account the ledger keeps, too."""
    from .session import analyst_account, table_account

    if (analyst is None) == (table is None):
        raise errors.InterfaceError("name one analyst, or one table with --table")
    if table is not None:
        if table not in policy.tables or policy.tables[table].total_budget is None:
            with_budget = [t.name for t in policy.tables.values() if t.total_budget]
            raise errors.UndefinedObject(
                f"table {table!r} has no total budget in the policy",
                hint=f"tables with one: {', '.join(with_budget) or 'none'}")
        return table_account(table)
    assert analyst is not None
    if any(s.account == analyst_account(analyst) for s in ledger.statuses()):
        return analyst_account(analyst)
    if analyst not in policy.analysts or policy.analysts[analyst].budget is None:
        raise errors.UndefinedObject(f"analyst {analyst!r} has no budget in the policy",
                                     hint=f"analysts: {', '.join(policy.analysts)}")
    return analyst_account(analyst)


def _status_row(s: Any) -> dict[str, Any]:
    return {"account": s.account, "epsilon_budget": s.budget.epsilon,
            "epsilon_spent": s.spent.epsilon, "epsilon_remaining": s.remaining.epsilon,
            "delta_budget": s.budget.delta, "delta_spent": s.spent.delta,
            "delta_remaining": s.remaining.delta}


def _print_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    columns = tuple(rows[0]) if rows else ("account",)
    print(format_table(Result(columns, [tuple(r.values()) for r in rows], "SELECT")))


def cmd_budget_show(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    with open_ledger(policy) as ledger:
        if args.analyst or args.table:
            statuses = [ledger.status(_account(policy, args.analyst, args.table, ledger))]
        else:
            statuses = ledger.statuses()
    _print_rows([_status_row(s) for s in statuses], args.json)
    return 0


def _admin_change(args: argparse.Namespace, action: str) -> int:
    from .accountant import Cost

    policy = load_policy(args.policy)
    with open_ledger(policy) as ledger:
        account = _account(policy, args.analyst, args.table, ledger)
        if action == "grant":
            status = ledger.grant(account, Cost(args.epsilon, args.delta or 0.0), by=args.by)
        elif action == "set":  # without --delta, only ε is replaced
            status = ledger.set_budget(account, Cost(args.epsilon, args.delta or 0.0),
                                       by=args.by, keep_delta=args.delta is None)
        else:
            status = ledger.reset(account, by=args.by)
    _print_rows([_status_row(status)], args.json)
    return 0


def cmd_budget_window(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    with open_ledger(policy, adopt_window_by=args.by):
        pass
    print(f"the ledger counts spending with budget_window = "
          f"{policy.privacy.budget_window!r}")
    return 0


def cmd_budget_history(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    with open_ledger(policy) as ledger:
        account = _account(policy, args.analyst, args.table, ledger) \
            if args.analyst or args.table else None
        entries = ledger.timeline(account, limit=args.limit)
    rows = [{"at": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.at)), "who": e.who,
             "what": e.what, "epsilon": e.amount.epsilon, "delta": e.amount.delta,
             "accounts": e.accounts, "detail": e.detail} for e in entries]
    _print_rows(rows, args.json)
    return 0


def cmd_policy_check(args: argparse.Namespace) -> int:
    policy, problems = check_policy(args.file)
    for problem in problems:  # every one, a line each: other commands stop at the first
        print(f"ERROR {problem.sqlstate}: {problem}", file=sys.stderr)
    if policy is None:
        return 1
    private = [t.name for t in policy.tables.values() if not t.public]
    public = [t.name for t in policy.tables.values() if t.public]
    print(f"{args.file}: OK — backend {policy.backend.kind}, {len(private)} private table(s) "
          f"({', '.join(private) or 'none'}), {len(public)} public table(s), "
          f"{len(policy.analysts)} analyst(s)")
    return 0


def _build_demo(path: Path, seed: int) -> None:
    from .demo import build_demo

    build_demo(path, seed=seed, progress=lambda message: print(f"demo: {message}",
                                                               file=sys.stderr))


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DEFAULT_SEED

    if args.postgres is not None:
        from .demo import load_demo_postgres

        load_demo_postgres(args.postgres, seed=args.seed or DEFAULT_SEED,
                           progress=lambda message: print(f"demo: {message}", file=sys.stderr))
        return 0
    if args.out is not None:
        path, seed = Path(args.out), args.seed or DEFAULT_SEED
    else:
        policy = load_policy(args.policy)
        if policy.backend.path is None:
            raise errors.InterfaceError("the policy's backend has no DuckDB path; use --out")
        path = policy.backend.path
        seed = args.seed or policy.backend.demo_seed or DEFAULT_SEED
    _build_demo(path, seed)
    return 0


# parser ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpproxy", description="Differentially private SQL: noisy, budgeted aggregates.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_policy(p: argparse.ArgumentParser) -> None:
        p.add_argument("--policy", type=Path, default=default_policy(),
                       help="policy file (default: policies/demo.toml)")

    def query_args(p: argparse.ArgumentParser) -> None:
        with_policy(p)
        p.add_argument("--analyst", help="who is asking (default: the policy's only analyst)")
        p.add_argument("--epsilon", type=float, help="ε for this query (default: the policy's)")
        p.add_argument("--delta", type=float, help="δ for this query (Gaussian)")
        p.add_argument("--mechanism", choices=("laplace", "gaussian"))
        p.add_argument("--split", help="weights of the aggregates in the ε split, e.g. 1,3 "
                                       "(default: even over the noisy statistics)")
        p.add_argument("sql", help="one SQL statement")

    q = sub.add_parser("query", help="run a query and print noisy answers with their accuracy")
    query_args(q)
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=cmd_query)

    e = sub.add_parser("explain", help="print the DP plan of a query; charges nothing")
    query_args(e)
    e.set_defaults(func=cmd_explain)

    b = sub.add_parser("budget", help="budget administration: show, grant, set, reset, "
                                      "history, window")
    bsub = b.add_subparsers(dest="budget_command", required=True, metavar="ACTION")

    def target(p: argparse.ArgumentParser, required: bool) -> None:
        with_policy(p)
        p.add_argument("analyst", nargs="?", help="the analyst" + ("" if required else
                                                                   " (default: all)"))
        p.add_argument("--table", help="a table's total budget instead of an analyst's")
        p.add_argument("--json", action="store_true", help="print JSON")

    show = bsub.add_parser("show", help="budgets, spent and remaining")
    target(show, required=False)
    show.set_defaults(func=cmd_budget_show)
    for action, text in (("grant", "add ε (and δ) to a budget"),
                         ("set", "replace a budget"),
                         ("reset", "forget what a budget has spent (history stays)")):
        cmd = bsub.add_parser(action, help=text)
        target(cmd, required=True)
        if action != "reset":
            cmd.add_argument("--epsilon", type=float, required=True)
            cmd.add_argument("--delta", type=float,
                             help="δ to add" if action == "grant" else
                             "the new δ budget (default: δ stays as it is)")
        cmd.add_argument("--by", default=os.environ.get("USER") or "cli",
                         help="who makes the change, for the record (default: $USER)")
        cmd.set_defaults(func=lambda a, action=action: _admin_change(a, action))
    window = bsub.add_parser("window", help="make the policy's budget_window the ledger's "
                                            "(stop other proxies on the ledger first)")
    with_policy(window)
    window.add_argument("--by", default=os.environ.get("USER") or "cli",
                        help="who makes the change, for the record (default: $USER)")
    window.set_defaults(func=cmd_budget_window)
    history = bsub.add_parser("history", help="charges and admin changes, newest first")
    target(history, required=False)
    history.add_argument("--limit", type=int, default=50)
    history.set_defaults(func=cmd_budget_history)

    p = sub.add_parser("policy", help="policy files")
    psub = p.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    check = psub.add_parser("check", help="validate a policy file")
    check.add_argument("file", type=Path)
    check.set_defaults(func=cmd_policy_check)

    d = sub.add_parser("demo", help="build the demo database from its seed")
    with_policy(d)
    d.add_argument("--out", type=Path, help="write here instead of the policy's backend path")
    d.add_argument("--postgres", metavar="DSN",
                   help="create the demo tables in this PostgreSQL database instead "
                        "(password: PGPASSWORD or ~/.pgpass)")
    d.add_argument("--seed", type=int, help="random seed (default: the policy's demo_seed)")
    d.set_defaults(func=cmd_demo)

    from .server.commands import register  # `serve` and `analyst passwd`

    register(sub, with_policy)
    from .ldp import register as register_ldp  # `ldp encode | estimate | demo`

    register_ldp(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except errors.Error as exc:
        print(f"ERROR {exc.sqlstate}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
