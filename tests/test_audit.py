"""The audit log keeps its file open between records and follows the path when the file is
rotated or deleted: every record is in a file, whole, in order."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from dpproxy.audit import AuditLog, AuditRecord


def _record(n: int) -> AuditRecord:
    return AuditRecord(analyst="alice", statement=f"SELECT {n}", outcome="answered", rows=1)


def _numbers(path: Path) -> list[int]:
    return [int(json.loads(line)["statement"].split()[1])
            for line in path.read_text(encoding="utf-8").splitlines()]


def test_records_are_appended_and_readable_at_once(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "audit.jsonl"
    path.parent.mkdir()
    path.write_text('{"earlier": true}\n', encoding="utf-8")
    log = AuditLog(path)
    for n in range(3):
        log.write(_record(n))
        assert len(path.read_text(encoding="utf-8").splitlines()) == n + 2  # flushed
    log.close()
    log.write(_record(3))  # reopened after close
    lines = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0]) == {"earlier": True}
    assert [json.loads(line)["statement"] for line in lines[1:]] == [
        "SELECT 0", "SELECT 1", "SELECT 2", "SELECT 3"]
    log.close()


def test_a_rotated_or_deleted_file_is_followed(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    log.write(_record(0))
    path.rename(tmp_path / "audit.jsonl.1")  # rotated
    log.write(_record(1))
    log.write(_record(2))
    path.unlink()  # deleted
    log.write(_record(3))
    log.close()
    assert _numbers(tmp_path / "audit.jsonl.1") == [0]
    assert _numbers(path) == [3]
    assert not (tmp_path / "audit.jsonl.2").exists()


def test_two_logs_on_one_file_write_whole_lines(tmp_path: Path) -> None:
    """Like two worker processes: each keeps its own handle, appending."""
    path = tmp_path / "audit.jsonl"
    logs = [AuditLog(path), AuditLog(path)]

    def writer(log: AuditLog, offset: int) -> None:
        for n in range(500):
            log.write(_record(offset + n))

    threads = [threading.Thread(target=writer, args=(log, 1000 * i))
               for i, log in enumerate(logs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for log in logs:
        log.close()
    numbers = _numbers(path)
    assert sorted(numbers) == list(range(500)) + list(range(1000, 1500))
    assert [n for n in numbers if n < 1000] == list(range(500))  # each in its own order
