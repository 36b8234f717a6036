"""Statements run off the event loop, cancellable only until they are charged.

A cancel request or a statement timeout may stop a statement that has not
been charged yet. Once the ledger is asked to charge it, the statement runs
to completion: its budget is spent, so cancelling would waste it, and
nothing is ever released without its charge. `ChargeGate` wraps the
engine's ledger and is the one place where that line is crossed: it asks the
thread's current `Job` for permission right before charging.

>>> job = Job()
>>> job.try_cancel()
True
>>> job = Job()
>>> job.before_charge()
>>> job.try_cancel()
False
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .. import errors

T = TypeVar("T")
_current = threading.local()


class QueryCanceled(errors.OperationalError):
    sqlstate = "57014"


class Job:
    """One statement's run in a worker thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cancelled = False
        self.charged = False
        self.reason = "canceling statement due to user request"

    def try_cancel(self, reason: str | None = None) -> bool:
        """Stop the statement unless it is already being charged; True if it will stop."""
        with self._lock:
            if self.charged:
                return False
            if not self.cancelled and reason:
                self.reason = reason
            self.cancelled = True
            return True

    def before_charge(self) -> None:
        """Called by the ledger gate: from here on the statement cannot be cancelled."""
        with self._lock:
            if self.cancelled:
                raise QueryCanceled(self.reason, detail="nothing was charged")
            self.charged = True

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` in this (worker) thread, as this job."""
        with self._lock:
            if self.cancelled:
                raise QueryCanceled(self.reason, detail="nothing was charged")
        _current.job = self
        try:
            return fn(*args)
        finally:
            _current.job = None


def current_job() -> Job | None:
    return getattr(_current, "job", None)


class ChargeGate:
    """The engine's ledger, with each charge first cleared by the running job."""

    def __init__(self, ledger: Any) -> None:
        self._ledger = ledger

    def charge(self, *args: Any, **kwargs: Any) -> Any:
        job = current_job()
        if job is not None:
            job.before_charge()
        return self._ledger.charge(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


def install_gate(engine: Any) -> None:
    """Route the engine's charges through a ChargeGate (once)."""
    if not isinstance(engine.ledger, ChargeGate):
        engine.ledger = ChargeGate(engine.ledger)
