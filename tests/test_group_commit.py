"""Group commit in the SQLite ledger: charges queued by several threads commit in one
transaction, each checked on its own; the answer store skips its fsync; a killed process
never loses a charge whose call returned."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dpproxy.accountant import AnswerAvailable, Cost, Ledger
from dpproxy.errors import BudgetExceeded, UndefinedObject

REPO = str(Path(__file__).resolve().parents[1])
ALICE = "analyst:alice"


def _queue_behind_the_lock(ledger: Ledger, calls: list[tuple[str, dict[str, object]]]
                           ) -> list[object]:
    """Start one thread per charge while the test holds the ledger's lock, wait until all
    are queued, then let them go: they commit as one batch. Returns each outcome."""
    outcomes: list[object] = [None] * len(calls)

    def run(i: int, account: str, kwargs: dict[str, object]) -> None:
        try:
            outcomes[i] = ledger.charge([account], Cost(0.2), analyst="alice",
                                        statement=f"q{i}", **kwargs)  # type: ignore[arg-type]
        except Exception as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i, a, kw)) for i, (a, kw) in enumerate(calls)]
    with ledger._lock:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while len(ledger._queue) < len(calls) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(ledger._queue) == len(calls)  # all waiting for one group commit
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return outcomes


def test_a_batch_commits_the_charges_that_fit_and_refuses_the_rest(tmp_path: Path) -> None:
    with Ledger(tmp_path / "g.db", {ALICE: Cost(1.0)}) as ledger:
        # 8 charges of 0.2 against a budget of 1.0, plus one on an unknown account
        outcomes = _queue_behind_the_lock(ledger, [(ALICE, {})] * 8 + [("analyst:nobody", {})])
        charged = [o for o in outcomes if not isinstance(o, Exception)]
        assert len(charged) == 5
        assert sum(isinstance(o, BudgetExceeded) for o in outcomes) == 3
        assert isinstance(outcomes[-1], UndefinedObject)
        assert ledger.status(ALICE).spent == Cost(1.0, 0.0)
        assert sorted(c.charge_id for c in ledger.history(ALICE)) == \
            sorted(c.charge_id for c in charged)  # type: ignore[attr-defined]
        assert ledger._queue == []


def test_two_claims_of_one_key_in_a_batch_charge_once(tmp_path: Path) -> None:
    with Ledger(tmp_path / "c.db", {ALICE: Cost(1.0)}) as ledger:
        outcomes = _queue_behind_the_lock(ledger, [(ALICE, {"claim": "k"}),
                                                   (ALICE, {"claim": "k"}),
                                                   (ALICE, {"claim": "other"})])
        pending = [o for o in outcomes if isinstance(o, AnswerAvailable)]
        assert len(pending) == 1 and pending[0].answer is None
        assert ledger.status(ALICE).spent == Cost(0.4, 0.0)


def test_answers_are_stored_without_leaving_the_connection_unsynced(tmp_path: Path) -> None:
    with Ledger(tmp_path / "a.db", {ALICE: Cost(1.0)}) as ledger:
        charge = ledger.charge([ALICE], Cost(0.1), analyst="alice", statement="q", claim="k")
        ledger.store_answer("alice", "k", charge.charge_id, "[1]")
        assert ledger._db is not None
        assert ledger._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again
        found = ledger.lookup_answer("alice", "k")
        assert found is not None and found.answer == "[1]"
    with Ledger(tmp_path / "a.db", {}) as reopened:
        found = reopened.lookup_answer("alice", "k")
        assert found is not None and found.answer == "[1]"


def test_without_fast_commits_threads_still_spend_exactly_the_budget(tmp_path: Path) -> None:
    with Ledger(tmp_path / "s.db", {ALICE: Cost(1.0)}, fast_commits=False) as ledger:
        wins: list[int] = []

        def worker() -> None:
            for _ in range(3):
                try:
                    ledger.charge([ALICE], Cost(0.1), analyst="alice", statement="q")
                    wins.append(1)
                except BudgetExceeded:
                    pass

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(wins) == 10 and ledger.status(ALICE).spent == Cost(1.0, 0.0)
        assert ledger._queue == []  # nothing went through the group-commit queue


_CHURN = """
import sys, threading
sys.path.insert(0, {repo!r})
from dpproxy.accountant import Cost, Ledger
ledger = Ledger({path!r}, {{"analyst:alice": Cost(1e6, 0.5)}})
out = threading.Lock()

def worker(n):
    for i in range(100000):
        key = f"{{n}}-{{i}}"
        c = ledger.charge(["analyst:alice"], Cost(0.001), analyst="alice", statement="q",
                          claim=key)
        with out:
            print("CHARGED", c.charge_id, flush=True)
        ledger.store_answer("alice", key, c.charge_id, "[1]")
        with out:
            print("ANSWERED", key, flush=True)

for n in range(8):
    threading.Thread(target=worker, args=(n,), daemon=True).start()
threading.Event().wait()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")
def test_killed_mid_batch_loses_no_returned_charge_or_answer(tmp_path: Path) -> None:
    path = str(tmp_path / "churn.db")
    p = subprocess.Popen([sys.executable, "-c", _CHURN.format(repo=REPO, path=path)],
                         stdout=subprocess.PIPE, text=True)
    charged: list[str] = []
    answered: list[str] = []
    try:
        assert p.stdout is not None
        while len(charged) < 200:  # 8 threads charging: killed in the middle of batches
            word, value = p.stdout.readline().split()
            (charged if word == "CHARGED" else answered).append(value)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    assert p.returncode == -signal.SIGKILL
    with Ledger(path, {}) as ledger:
        history = {c.charge_id for c in ledger.history(ALICE, limit=10**6)}
        assert set(charged) <= history  # every charge that returned is on disk
        for key in answered:  # a killed process keeps answers (only an OS crash may not)
            found = ledger.lookup_answer("alice", key)
            assert found is not None and found.answer == "[1]"
        # spent is exactly the sum of the recorded charges: no half-written batch
        assert ledger.status(ALICE).spent.epsilon == pytest.approx(0.001 * len(history))
