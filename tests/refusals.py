"""The check every refusal test makes: the SQLSTATE, the words that say how to fix it, and
that nothing was charged."""

from __future__ import annotations

import pytest

from dpproxy import errors
from dpproxy.session import Engine


def assert_refused(engine: Engine, sql: str, sqlstate: str, words: str = "") -> None:
    """alice's `sql` is refused with `sqlstate`, its message or hint holding `words`, and
    her budget untouched."""
    with pytest.raises(errors.Error) as caught:
        engine.session("alice", epsilon=1.0).execute(sql)
    assert caught.value.sqlstate == sqlstate, str(caught.value)
    assert words in str(caught.value) + str(caught.value.hint or "")
    assert engine.ledger.status("analyst:alice").spent.epsilon == 0
