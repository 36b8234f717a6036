"""The private table a query reads: found in the policy, granted, present in the database."""

from __future__ import annotations

from sqlglot import exp

from ..errors import NotSupportedError, PrivacyViolation, UndefinedTable
from ..policy import AnalystPolicy, Policy, TablePolicy
from .expressions import by_name, quoted


def private_table(source: exp.Table, policy: Policy, analyst: AnalystPolicy,
                  joined: bool = False) -> TablePolicy:
    """The policy's table `source` names (exactly, else case-insensitively, in schema
    public), or the refusal saying why it may not be read: unknown, a public lookup table
    (`joined`: the query joins it to others), not granted to `analyst`, or missing from
    the database. Raised before anything is charged."""
    table = named_table(source, policy)
    granted = ", ".join(analyst.tables) or "none"
    if table is None:
        raise UndefinedTable(f'relation "{source.name}" does not exist',
                             hint=f"tables you may query: {granted}")
    if table.public and joined:
        raise NotSupportedError(f"{table.name} is a public lookup table: a join must start "
                                "from the private table",
                                hint=f"FROM <private table> JOIN {table.name} ON …")
    if table.public:
        raise NotSupportedError(f"{table.name} is a public lookup table; reading it directly "
                                "is not supported yet", hint="query a private table")
    if table.name not in analyst.tables:
        raise PrivacyViolation(f"permission denied for table {table.name}",
                               hint=f"tables granted to {analyst.name}: {granted}")
    if table.columns and all(c.storage == "" for c in table.columns.values()):
        # refused before anything is charged: running it could only fail
        raise UndefinedTable(f'relation "{table.name}" is in the policy but not in the '
                             "database", hint="ask the data owner to fix the policy")
    return table


def named_table(source: exp.Table, policy: Policy) -> TablePolicy | None:
    """The policy's table `source` names, exactly, else case-insensitively; None if it
    names none; UndefinedTable for a schema other than public."""
    if source.catalog or (source.db and source.db.lower() != "public"):
        raise UndefinedTable(f"relation {source.sql('postgres')} does not exist",
                             hint="tables live in schema public")
    return by_name(policy.tables, source.name, quoted(source))
