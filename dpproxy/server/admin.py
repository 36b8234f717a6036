"""Budget administration as SQL, over the wire, for analysts with `role = "admin"`.

The syntax (parsed with sqlglot, never matched as text):

- `SELECT * FROM dpproxy.budgets`: every account, its budget, spent and remaining;
- `CALL dpproxy.grant('alice', 1.0 [, 1e-6])`: add ε (and δ) to alice's budget;
- `CALL dpproxy.set_budget('alice', 5.0 [, 1e-5])`: replace alice's ε budget (and δ
  budget, if given; without it δ stays as it is);
- `CALL dpproxy.reset('alice')`: forget what alice has spent (her history stays);
- `SELECT * FROM dpproxy.history`: charges and admin events, newest first (the last 1,000).

An account is an analyst name (`'alice'` means `analyst:alice`) or a full
account name (`'table:adult'`). The CALLs answer with the account's new
status. Anyone else gets 42501.

>>> command("CALL dpproxy.grant('alice', 1.0, 0)")
AdminCommand(action='grant', account='analyst:alice', epsilon=1.0, delta=0.0)
>>> command("SELECT * FROM dpproxy.budgets")
AdminCommand(action='budgets', account=None, epsilon=None, delta=None)
>>> command("SELECT COUNT(*) FROM adult") is None
True
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from .. import errors
from ..accountant import AccountStatus, Cost
from ..parse import DIALECT, bind_parameters, split_statements
from ..session import Description, Engine, Result, analyst_account

SCHEMA = "dpproxy"
BUDGET_COLUMNS = ("account", "epsilon_budget", "epsilon_spent", "epsilon_remaining",
                  "delta_budget", "delta_spent", "delta_remaining")
BUDGET_TYPES = ("text",) + ("float8",) * 6
HISTORY_COLUMNS = ("at", "who", "what", "accounts", "epsilon", "delta", "detail")
HISTORY_TYPES = ("timestamptz", "text", "text", "text", "float8", "float8", "text")
HISTORY_ROWS = 1000
_PROCEDURES = ("grant", "set_budget", "reset")
_VIEWS = ("budgets", "history")
_USAGE = ("SELECT * FROM dpproxy.budgets; SELECT * FROM dpproxy.history; "
          "CALL dpproxy.grant('alice', 1.0, 0); CALL dpproxy.set_budget('alice', 5.0, 1e-5); "
          "CALL dpproxy.reset('alice')")


@dataclass(frozen=True)
class AdminCommand:
    action: str  # "budgets", "history", "grant", "set_budget" or "reset"
    account: str | None = None
    epsilon: float | None = None
    delta: float | None = None


def _number(node: exp.Expression, what: str) -> float:
    negative = isinstance(node, exp.Neg)
    inner = node.this if negative else node
    if not isinstance(inner, exp.Literal) or inner.is_string:
        raise errors.InvalidParameterValue(f"{what} must be a number", hint=_USAGE)
    value = float(inner.this)
    return -value if negative else value


def _call(text: str, params: Sequence[object] | None) -> AdminCommand | None:
    try:
        call = sqlglot.parse_one(text, read=DIALECT)
    except (ParseError, TokenError):
        return None
    if not (isinstance(call, exp.Dot) and isinstance(call.this, exp.Identifier)
            and call.this.name.lower() == SCHEMA and isinstance(call.expression, exp.Anonymous)):
        return None
    name = call.expression.name.lower()
    if name not in _PROCEDURES:
        raise errors.UndefinedObject(f"procedure dpproxy.{name} does not exist", hint=_USAGE)
    args = list(call.expression.expressions)
    if params:
        args = list(bind_parameters(exp.Tuple(expressions=args), params).expressions)
    if name == "reset" and len(args) != 1:
        raise errors.SyntaxError("dpproxy.reset takes (account)", hint=_USAGE)
    if name != "reset" and not 2 <= len(args) <= 3:
        raise errors.SyntaxError(f"dpproxy.{name} takes (account, epsilon [, delta])",
                                 hint=_USAGE)
    target = args[0]
    if not (isinstance(target, exp.Literal) and target.is_string and target.this):
        raise errors.InvalidParameterValue("the account must be a string such as 'alice'",
                                           hint=_USAGE)
    account = target.this if ":" in target.this else analyst_account(target.this)
    if name == "reset":
        return AdminCommand(name, account)
    epsilon = _number(args[1], "epsilon")
    # set_budget without δ replaces only ε; grant without δ adds none
    delta = _number(args[2], "delta") if len(args) == 3 else None if name == "set_budget" \
        else 0.0
    return AdminCommand(name, account, epsilon, delta)


def _view(select: exp.Expression) -> str | None:
    """Which of dpproxy's admin views (`_VIEWS`) the SELECT reads, if one."""
    if not isinstance(select, exp.Select):
        return None
    source = select.args.get("from_")
    table = source.this if source is not None else None
    if isinstance(table, exp.Table) and table.db.lower() == SCHEMA \
            and table.name.lower() in _VIEWS:
        return table.name.lower()
    return None


def command(sql: str, params: Sequence[object] | None = None) -> AdminCommand | None:
    """The admin command `sql` is, or None when it is not one."""
    if SCHEMA not in sql.lower():  # cheap pre-check; the parse below decides
        return None
    pieces = split_statements(sql)
    if len(pieces) != 1:
        return None
    text, tokens = pieces[0][0], pieces[0][1]
    if tokens[0].text.upper() == "CALL":
        # the tokenizer hands what follows CALL over as one string token
        return _call(text[tokens[0].end + 1:].strip(), params)
    if tokens[0].token_type != TokenType.SELECT:
        return None
    try:
        tree = sqlglot.parse_one(text, read=DIALECT)
    except (ParseError, TokenError):
        return None
    view = _view(tree)
    if view is None:
        return None
    assert isinstance(tree, exp.Select)
    extra = [k for k in ("where", "group", "having", "joins", "order", "limit")
             if tree.args.get(k)]
    if extra or not (len(tree.expressions) == 1 and isinstance(tree.expressions[0], exp.Star)):
        raise errors.NotSupportedError(f"only SELECT * FROM dpproxy.{view} is supported",
                                       hint=_USAGE)
    return AdminCommand(view)


def _check_role(role: str) -> None:
    if role != "admin":
        raise errors.PrivacyViolation(
            "permission denied: budget administration needs role admin",
            hint="ask an administrator; your own budget is in SHOW dpproxy.budget")


def describe(cmd: AdminCommand, role: str) -> Description:
    """The result shape of an admin command; 42501 unless the role is admin."""
    _check_role(role)
    if cmd.action == "history":
        return Description(HISTORY_COLUMNS, HISTORY_TYPES)
    return Description(BUDGET_COLUMNS, BUDGET_TYPES)


def _row(status: AccountStatus) -> tuple[object, ...]:
    left = status.remaining
    return (status.account, status.budget.epsilon, status.spent.epsilon, left.epsilon,
            status.budget.delta, status.spent.delta, left.delta)


def run(cmd: AdminCommand, engine: Engine, analyst: str, role: str) -> Result:
    """Run an admin command for `analyst`; 42501 unless their role is admin."""
    _check_role(role)
    if cmd.action == "budgets":
        rows = [_row(s) for s in engine.ledger.statuses()]
        return Result(BUDGET_COLUMNS, rows, f"SELECT {len(rows)}", BUDGET_TYPES)
    if cmd.action == "history":
        history = [(dt.datetime.fromtimestamp(e.at, dt.UTC), e.who, e.what, e.accounts,
                    e.amount.epsilon, e.amount.delta, e.detail)
                   for e in engine.ledger.timeline(limit=HISTORY_ROWS)]
        return Result(HISTORY_COLUMNS, history, f"SELECT {len(history)}", HISTORY_TYPES)
    assert cmd.account is not None
    if cmd.action == "reset":
        status = engine.ledger.reset(cmd.account, by=f"analyst:{analyst}")
        logging.getLogger("dpproxy.server").info("admin %s: reset %s", analyst, cmd.account)
        return Result(BUDGET_COLUMNS, [_row(status)], "CALL", BUDGET_TYPES)
    assert cmd.epsilon is not None
    amount = Cost(cmd.epsilon, cmd.delta or 0.0)
    if cmd.action == "grant":
        status = engine.ledger.grant(cmd.account, amount, by=f"analyst:{analyst}")
    else:
        status = engine.ledger.set_budget(cmd.account, amount, by=f"analyst:{analyst}",
                                          keep_delta=cmd.delta is None)
    logging.getLogger("dpproxy.server").info("admin %s: %s %s ε=%g δ=%g", analyst, cmd.action,
                                             cmd.account, cmd.epsilon, status.budget.delta)
    return Result(BUDGET_COLUMNS, [_row(status)], "CALL", BUDGET_TYPES)
