"""Add or remove an analyst by editing the policy file's text.

Analysts are part of the policy (SPEC section 3); `dpproxy analyst add` appends an
`[analysts.<name>]` table and `dpproxy analyst remove` deletes one, leaving every other
line, comments included, as it was. The result is checked by loading it (with the
policy's folder, so relative paths resolve alike) before it replaces the file, in one
rename. The ledger keeps a removed analyst's account and history. A running server takes
the change at the next login or statement (`Engine.refresh_analysts`); an admin can make
it over the wire too (`dpproxy.server.admin`).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: edits are not serialized
    fcntl = None  # type: ignore[assignment]

from .errors import InvalidParameterValue, InvalidPolicy, UndefinedObject
from .policy import ROLES, load_policy
from .policy_lines import key_positions

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def table_names(text: str) -> tuple[str, ...]:
    """Table names written comma-separated ('adult, visits'), as `analyst add --tables`
    and `dpproxy.add_analyst` take them."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


@contextmanager
def _editing(path: Path) -> Iterator[None]:
    """Hold the lock of the policy's folder while reading, checking and replacing the file:
    edits from several connections, worker processes or CLI runs at once would otherwise
    each start from the same text, and all but one would be lost. (The file itself is
    replaced by a rename, so its folder, not it, carries the lock.)"""
    if fcntl is None:
        yield
        return
    handle = os.open(path.parent, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock


def add_analyst(path: Path, name: str, tables: Sequence[str], epsilon: float | None,
                delta: float, role: str = "analyst",
                before_write: Callable[[], None] | None = None) -> None:
    """Append `[analysts.<name>]` with its tables and budget (none for an admin without
    one) to the policy file. `before_write` runs once every check passed, before the file
    names the analyst (a password an earlier analyst of that name left is forgotten then:
    not before a refusal, which would drop a current analyst's)."""
    with _editing(path):
        _add_analyst(path, name, tables, epsilon, delta, role, before_write)


def remove_analyst(path: Path, name: str) -> None:
    """Delete `[analysts.<name>]` (its header through its last line, not the comments or
    blank lines before the next table) from the policy file."""
    with _editing(path):
        _remove_analyst(path, name)


def _add_analyst(path: Path, name: str, tables: Sequence[str], epsilon: float | None,
                 delta: float, role: str, before_write: Callable[[], None] | None = None
                 ) -> None:
    policy = load_policy(path)
    if name in policy.analysts:
        raise InvalidParameterValue(f"analyst {name!r} is already in policy {path.name}")
    if not name or name != name.strip():
        raise InvalidParameterValue(f"analyst name {name!r} is empty or starts or ends with "
                                    "a space")
    # ALTER ROLE Alice folds to alice, as PostgreSQL does: two analysts apart by case alone
    # would receive each other's passwords
    alike = [a for a in policy.analysts if a.lower() == name.lower()]
    if alike:
        raise InvalidParameterValue(f"analyst {name!r} differs from analyst {alike[0]!r} "
                                    "only by case", hint="choose another name")
    if role not in ROLES:
        raise InvalidParameterValue(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    unknown = [t for t in tables if t not in policy.tables]
    if unknown:
        raise UndefinedObject(f"table {unknown[0]!r} is not in policy {path.name}",
                              hint=f"tables: {', '.join(policy.tables)}")
    # JSON strings and numbers are TOML's too: a name that is not a bare key, and the
    # tables, are quoted as such
    key = name if _BARE_KEY.fullmatch(name) else json.dumps(name)
    lines = [f"[analysts.{key}]"]
    if role != "analyst":
        lines.append(f"role = {json.dumps(role)}")
    if epsilon is not None:
        lines.append(f"budget = {{ epsilon = {epsilon!r}, delta = {delta!r} }}")
    if tables:
        lines.append(f"tables = [{', '.join(json.dumps(t) for t in tables)}]")
    text = path.read_text()
    if before_write is not None:
        before_write()
    _replace(path, text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n",
             {*policy.analysts, name})


def _remove_analyst(path: Path, name: str) -> None:
    policy = load_policy(path)
    if name not in policy.analysts:
        raise UndefinedObject(f"analyst {name!r} is not in policy {path.name}",
                              hint=f"analysts: {', '.join(sorted(policy.analysts))}")
    text = path.read_text()
    positions = key_positions(text)
    own = ("analysts", name)
    if own not in positions:
        raise InvalidParameterValue(f"the position of analyst {name!r} in {path.name} "
                                    "cannot be read", hint="edit the policy file by hand")
    lines = text.splitlines(keepends=True)
    first = positions[own][0]
    if not lines[first - 1].lstrip().startswith("["):  # written inline: not its own lines
        raise InvalidParameterValue(f"analyst {name!r} is not written as its own "
                                    f"[analysts.{name}] table in {path.name}",
                                    hint="edit the policy file by hand")
    others = [line for key, (line, _) in positions.items()
              if line > first and key[:2] != own]
    end = min(others) if others else len(lines) + 1  # the first line of what follows
    while end - 1 > first and _blank_or_comment(lines[end - 2]):
        end -= 1  # such lines before the next table belong to it
    _replace(path, "".join(lines[:first - 1] + lines[end - 1:]),
             set(policy.analysts) - {name})


def _blank_or_comment(line: str) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith("#")


def _replace(path: Path, text: str, analysts: set[str]) -> None:
    """Check `text` loads as a policy with exactly these analysts, then make it the file's
    content in one rename."""
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".toml", dir=path.parent)
    scratch = Path(name)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        try:
            loaded = load_policy(scratch)
        except InvalidPolicy as exc:  # name the policy, not the scratch file
            raise InvalidPolicy(exc.message.replace(str(scratch), path.name),
                                detail=exc.detail, hint=exc.hint) from None
        if set(loaded.analysts) != analysts:
            raise InvalidParameterValue(f"editing {path.name} would not change just that "
                                        "analyst; nothing was changed",
                                        hint="edit the policy file by hand")
        os.chmod(scratch, path.stat().st_mode)
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)
