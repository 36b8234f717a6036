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

import asyncio
import contextlib
import queue
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


_Work = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class StatementThreads:
    """Worker threads that run statements off the event loop, each result handed straight
    to a future of the loop that asked: `loop.run_in_executor` without the
    concurrent.futures.Future it chains to an asyncio one (a good share of the loop's own
    time per statement). A thread is started when work is queued and none is idle, up to
    `max_threads`; threads live until `shutdown`."""

    def __init__(self, max_threads: int, name: str = "dpproxy-worker") -> None:
        self._max, self._name = max_threads, name
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # released by each thread waiting for work
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: Any
               ) -> asyncio.Future[T]:
        """Run `fn(*args)` in a worker thread; its outcome is the returned future's."""
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the statement threads are shut down")
            self._queue.put((loop, future, fn, args))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self._name}-{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        # a new thread starts on the work it was started for: it counts itself idle only
        # once that is done (counted at its start, it stood for an idle thread while busy,
        # and `submit` queued the next statement behind a long one instead of starting one)
        while True:
            work = self._queue.get()
            if work is None:
                return
            loop, future, fn, args = work
            result, error = None, None
            try:
                result = fn(*args)
            except BaseException as exc:  # the caller's to handle, whatever it is
                error = exc
            # (a closed loop: nobody waits for this any more)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, result, error)
            del work, future, result, error
            self._idle.release()

    def shutdown(self) -> None:
        """Cancel the work not started yet, let running work finish, stop every thread."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        while True:
            try:
                work = self._queue.get_nowait()
            except queue.Empty:
                break
            if work is not None:
                loop, future, _, _ = work
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(future.cancel)
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            thread.join()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
