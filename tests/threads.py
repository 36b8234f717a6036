"""Run one function in several threads at once, for tests of concurrent use."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_in_threads(target: Callable[[int], None], count: int, timeout_s: float = 60.0
                   ) -> None:
    """`target(i)` for i in 0 … count − 1, each in its own thread, all started before any
    is joined; asserts that every thread finished in time and none raised (the first
    error is raised here, with its own traceback)."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "a thread did not finish in time"
    if errors:
        raise errors[0]
