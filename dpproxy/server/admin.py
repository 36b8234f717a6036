"""Budget administration as SQL, over the wire, for analysts with `role = "admin"`.

The syntax (parsed with sqlglot, never matched as text):

- `SELECT * FROM dpproxy.budgets`: every account, its budget, spent and remaining;
- `CALL dpproxy.grant('alice', 1.0 [, 1e-6])`: add ε (and δ) to alice's budget;
- `CALL dpproxy.set_budget('alice', 5.0 [, 1e-5])`: replace alice's ε budget (and δ
  budget, if given; without it δ stays as it is);
- `CALL dpproxy.reset('alice')`: forget what alice has spent (her history stays);
- `SELECT * FROM dpproxy.history`: charges and admin events, newest first (the last 1,000);
- `CALL dpproxy.add_analyst('bob', ARRAY['adult'], 2.0 [, 1e-6 [, 'admin']])`: add an
  analyst to the policy file (tables as an ARRAY or as 'adult,visits'; ε NULL for an
  admin without a budget), as `dpproxy analyst add` does;
- `CALL dpproxy.remove_analyst('bob')`: remove one (the ledger keeps its account and
  history; its stored password is dropped), as `dpproxy analyst remove` does;
- `ALTER ROLE bob [WITH] PASSWORD 'secret'` (or `ALTER USER`; CURRENT_USER for oneself):
  set a password, or store a SCRAM-SHA-256 verifier given in its place (what psql's
  `\\password` sends). An analyst may set their own; only an admin another's.

An account is an analyst name (`'alice'` means `analyst:alice`) or a full
account name (`'table:adult'`). The CALLs answer with the account's new
status. Anyone else gets 42501. A running server serves an added analyst, and refuses
a removed one, from their next login or statement (`Engine.refresh_analysts`).

>>> command("CALL dpproxy.grant('alice', 1.0, 0)")
AdminCommand(action='grant', account='analyst:alice', epsilon=1.0, delta=0.0, analyst=None)
>>> command("SELECT * FROM dpproxy.budgets")
AdminCommand(action='budgets', account=None, epsilon=None, delta=None, analyst=None)
>>> command("SELECT COUNT(*) FROM adult") is None
True
>>> command("ALTER ROLE Bob WITH PASSWORD 'secret'")
AdminCommand(action='password', account=None, epsilon=None, delta=None, analyst='bob')
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from .. import errors, policy_edit
from ..accountant import AccountStatus, Cost
from ..parse import DIALECT, bind_parameters, keyword, sets_password, split_statements
from ..session import Description, Engine, Result, analyst_account
from .credentials import CredentialStore
from .scram import parse_verifier

SCHEMA = "dpproxy"
BUDGET_COLUMNS = ("account", "epsilon_budget", "epsilon_spent", "epsilon_remaining",
                  "delta_budget", "delta_spent", "delta_remaining")
BUDGET_TYPES = ("text",) + ("float8",) * 6
HISTORY_COLUMNS = ("at", "who", "what", "accounts", "epsilon", "delta", "detail")
HISTORY_TYPES = ("timestamptz", "text", "text", "text", "float8", "float8", "text")
HISTORY_ROWS = 1000
_VIEWS = ("budgets", "history")
_USAGE = ("SELECT * FROM dpproxy.budgets; SELECT * FROM dpproxy.history; "
          "CALL dpproxy.grant('alice', 1.0, 0); CALL dpproxy.set_budget('alice', 5.0, 1e-5); "
          "CALL dpproxy.reset('alice'); CALL dpproxy.add_analyst('bob', ARRAY['adult'], 2.0, "
          "1e-6); CALL dpproxy.remove_analyst('bob'); ALTER ROLE bob PASSWORD '…'")


@dataclass(frozen=True)
class AdminCommand:
    # "budgets", "history", "grant", "set_budget", "reset", "add_analyst",
    # "remove_analyst" or "password"
    action: str
    account: str | None = None
    epsilon: float | None = None
    delta: float | None = None
    # add_analyst, remove_analyst and password: whom; add_analyst: what they get
    analyst: str | None = None
    tables: tuple[str, ...] = field(default=(), repr=False)
    role: str = field(default="analyst", repr=False)
    password: str | None = field(default=None, repr=False)  # never printed or logged


def _number(node: exp.Expression, what: str) -> float:
    negative = isinstance(node, exp.Neg)
    inner = node.this if negative else node
    if not isinstance(inner, exp.Literal) or inner.is_string:
        raise errors.InvalidParameterValue(f"{what} must be a number", hint=_USAGE)
    value = float(inner.this)
    return -value if negative else value


def _string(node: exp.Expression, what: str) -> str:
    if not (isinstance(node, exp.Literal) and node.is_string and node.this):
        raise errors.InvalidParameterValue(f"{what} must be a string such as 'alice'",
                                           hint=_USAGE)
    return str(node.this)


def _tables(node: exp.Expression) -> tuple[str, ...]:
    """ARRAY['adult', 'visits'], 'adult,visits', or NULL or '' for none."""
    if isinstance(node, exp.Null) or (isinstance(node, exp.Literal) and node.is_string
                                      and not node.this.strip()):
        return ()
    if isinstance(node, exp.Literal) and node.is_string:
        return policy_edit.table_names(node.this)
    if isinstance(node, exp.Array):
        return tuple(_string(t, "each table") for t in node.expressions)
    raise errors.InvalidParameterValue("tables must be an ARRAY of names or a string such "
                                       "as 'adult,visits'", hint=_USAGE)


# procedure → (least and most arguments, its signature)
_ARITY = {"reset": (1, 1, "account"), "grant": (2, 3, "account, epsilon [, delta]"),
          "set_budget": (2, 3, "account, epsilon [, delta]"),
          "add_analyst": (3, 5, "name, tables, epsilon [, delta [, role]]"),
          "remove_analyst": (1, 1, "name")}


def _call(text: str, params: Sequence[object] | None) -> AdminCommand | None:
    try:
        call = sqlglot.parse_one(text, read=DIALECT)
    except (ParseError, TokenError):
        return None
    if not (isinstance(call, exp.Dot) and isinstance(call.this, exp.Identifier)
            and call.this.name.lower() == SCHEMA and isinstance(call.expression, exp.Anonymous)):
        return None
    name = call.expression.name.lower()
    if name not in _ARITY:
        raise errors.UndefinedObject(f"procedure dpproxy.{name} does not exist", hint=_USAGE)
    args = list(call.expression.expressions)
    if params:
        args = list(bind_parameters(exp.Tuple(expressions=args), params).expressions)
    least, most, signature = _ARITY[name]
    if not least <= len(args) <= most:
        raise errors.SyntaxError(f"dpproxy.{name} takes ({signature})", hint=_USAGE)
    if name == "remove_analyst":
        return AdminCommand(name, analyst=_string(args[0], "the analyst"))
    if name == "add_analyst":
        analyst = _string(args[0], "the analyst")
        epsilon = None if isinstance(args[2], exp.Null) else _number(args[2], "epsilon")
        return AdminCommand(name, analyst_account(analyst), epsilon,
                            _number(args[3], "delta") if len(args) > 3 else 0.0,
                            analyst=analyst, tables=_tables(args[1]),
                            role=_string(args[4], "the role") if len(args) > 4 else "analyst")
    target = _string(args[0], "the account")
    account = target if ":" in target else analyst_account(target)
    if name == "reset":
        return AdminCommand(name, account)
    epsilon = _number(args[1], "epsilon")
    # set_budget without δ replaces only ε; grant without δ adds none
    delta = _number(args[2], "delta") if len(args) == 3 else None if name == "set_budget" \
        else 0.0
    return AdminCommand(name, account, epsilon, delta)


_YOURSELF = ("CURRENT_USER", "CURRENT_ROLE", "SESSION_USER")


def _only_password() -> errors.NotSupportedError:
    return errors.NotSupportedError(
        "only ALTER ROLE name [WITH] PASSWORD 'password' is supported",
        hint="a password (or a SCRAM-SHA-256 verifier) as a string literal")


def _role_name(token: Token) -> str | None:
    """A role name as PostgreSQL reads it: quoted as written, else folded to lower case;
    "" for CURRENT_USER and its synonyms (`_resolved` makes it the analyst asking)."""
    if token.token_type == TokenType.IDENTIFIER:
        return token.text
    if keyword(token) in _YOURSELF:
        return ""
    if token.token_type == TokenType.VAR or token.text.isidentifier():
        return token.text.lower()
    return None


def _alter_role(tokens: list[Token], params: Sequence[object] | None) -> AdminCommand | None:
    """ALTER ROLE|USER name [WITH] PASSWORD 'secret' | $1; None for an ALTER that sets no
    password (it then goes where other statements go)."""
    if not sets_password(tokens):
        return None
    name = _role_name(tokens[2])
    rest = tokens[3:]
    if rest and rest[0].token_type == TokenType.WITH:
        rest = rest[1:]
    if name is None or not rest or keyword(rest[0]) != "PASSWORD":
        raise _only_password()
    value = rest[1:]
    if len(value) == 1 and value[0].token_type == TokenType.STRING:
        password: object = value[0].text
    elif len(value) == 2 and value[0].token_type == TokenType.PARAMETER \
            and value[1].text.isdigit() and params is not None \
            and 1 <= int(value[1].text) <= len(params):
        password = params[int(value[1].text) - 1]
    else:
        raise _only_password()
    if not isinstance(password, str) or not password:
        raise errors.InvalidParameterValue("the password must be a non-empty string")
    return AdminCommand("password", analyst=name, password=password)


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
    # cheap pre-check; the parse below decides
    if SCHEMA not in sql.lower() and sql.lstrip()[:5].upper() != "ALTER":
        return None
    pieces = split_statements(sql)
    if len(pieces) != 1:
        return None
    text, tokens = pieces[0][0], pieces[0][1]
    if tokens[0].token_type == TokenType.ALTER:
        return _alter_role(tokens, params)
    if keyword(tokens[0]) == "CALL":
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


def _check_role(role: str, cmd: AdminCommand | None = None, analyst: str = "") -> None:
    if role == "admin":
        return
    if cmd is not None and cmd.action == "password":
        if cmd.analyst == analyst:
            return  # one's own password, as PostgreSQL allows
        raise errors.PrivacyViolation("permission denied: only an admin sets another "
                                      "analyst's password")
    raise errors.PrivacyViolation(
        "permission denied: budget administration needs role admin",
        hint="ask an administrator; your own budget is in SHOW dpproxy.budget")


def _resolved(cmd: AdminCommand, analyst: str) -> AdminCommand:
    """The command with CURRENT_USER (an empty name) made the analyst asking."""
    return replace(cmd, analyst=analyst) if cmd.analyst == "" else cmd


def describe(cmd: AdminCommand, role: str, analyst: str = "") -> Description:
    """The result shape of an admin command; 42501 unless the role is admin (or it sets
    the analyst's own password)."""
    _check_role(role, _resolved(cmd, analyst), analyst)
    if cmd.action == "history":
        return Description(HISTORY_COLUMNS, HISTORY_TYPES)
    if cmd.action == "password":
        return Description((), ())
    return Description(BUDGET_COLUMNS, BUDGET_TYPES)


def _row(status: AccountStatus) -> tuple[object, ...]:
    left = status.remaining
    return (status.account, status.budget.epsilon, status.spent.epsilon, left.epsilon,
            status.budget.delta, status.spent.delta, left.delta)


def run(cmd: AdminCommand, engine: Engine, analyst: str, role: str,
        credentials: CredentialStore | None = None) -> Result:
    """Run an admin command for `analyst`; 42501 unless their role is admin (or it sets
    their own password). Analysts are added to and removed from the policy file, which
    `engine` then reads again (`Engine.refresh_analysts`); passwords go to `credentials`
    (the engine policy's store when None)."""
    cmd = _resolved(cmd, analyst)
    _check_role(role, cmd, analyst)
    log = logging.getLogger("dpproxy.server")
    store = credentials if credentials is not None else CredentialStore(lambda: engine.policy)
    if cmd.action == "password":
        assert cmd.analyst is not None and cmd.password is not None
        engine.refresh_analysts()
        try:  # a valid verifier is stored as it is, anything else is the password itself,
            parse_verifier(cmd.password)  # as PostgreSQL decides
        except ValueError:
            store.set_password(cmd.analyst, cmd.password)
        else:
            store.set_verifier(cmd.analyst, cmd.password)
        log.info("admin %s: password of %s set", analyst, cmd.analyst)
        return Result(tag="ALTER ROLE")
    if cmd.action in ("add_analyst", "remove_analyst"):
        assert cmd.analyst is not None
        return _edit_analysts(cmd, engine, analyst, store)
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


def _edit_analysts(cmd: AdminCommand, engine: Engine, analyst: str,
                   store: CredentialStore) -> Result:
    """add_analyst or remove_analyst: the policy file edited as `dpproxy analyst add|remove`
    does, read again at once; the analyst's account status as the answer (none for an
    analyst without a budget)."""
    assert cmd.analyst is not None
    path = engine.policy.path
    if cmd.action == "add_analyst":
        # once it is checked, before the policy names them: a password left by an earlier
        # analyst of that name must never let anyone in
        name = cmd.analyst
        policy_edit.add_analyst(path, name, list(cmd.tables), cmd.epsilon,
                                cmd.delta or 0.0, cmd.role, lambda: store.forget(name))
    else:
        if cmd.analyst == analyst:
            raise errors.ObjectInUse("the current analyst cannot be removed",
                                     hint="remove it from another admin's connection")
        policy_edit.remove_analyst(path, cmd.analyst)
        store.forget(cmd.analyst)
    engine.refresh_analysts()
    logging.getLogger("dpproxy.server").info("admin %s: %s %s", analyst, cmd.action,
                                             cmd.analyst)
    account = analyst_account(cmd.analyst)
    statuses = [s for s in engine.ledger.statuses() if s.account == account]
    return Result(BUDGET_COLUMNS, [_row(s) for s in statuses], "CALL", BUDGET_TYPES)
