"""The audit log: one JSON line per statement — who, when, what, what it cost, the outcome.

It never holds a noiseless value, nor a backend error message (which may quote data),
nor a statement that sets a password.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .parse import without_passwords


@dataclass(frozen=True)
class AuditRecord:
    analyst: str
    statement: str
    # "released", "answered", "rejected", "failed"; over the wire also "admin" (a budget
    # command run) and "catalog" (a client's catalog query answered from the policy)
    outcome: str
    sqlstate: str | None = None
    epsilon: float = 0.0
    delta: float = 0.0
    rows: int | None = None
    charge_id: str | None = None


class AuditLog:
    """Appends records to its file, kept open between writes; a file moved away (rotated)
    or deleted is noticed at the next write, which opens a new one at the path."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: AuditRecord) -> None:
        if self.path is None:
            return
        entry: dict[str, Any] = {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                 **{k: v for k, v in record.__dict__.items() if v is not None}}
        entry["statement"] = without_passwords(record.statement)
        # ASCII: a U+2028 or U+0085 in a statement stays escaped, so every record is one
        # line whatever splits the file into lines
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        with self._lock:
            f = self._open()
            f.write(line)
            f.flush()  # each record reaches the file before the statement's answer

    def _open(self) -> TextIO:
        assert self.path is not None
        if self._file is not None:
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            opened = os.fstat(self._file.fileno())
            if current is not None and (current.st_ino, current.st_dev) \
                    == (opened.st_ino, opened.st_dev):
                return self._file
            self._file.close()
            self._file = None
        self._file = self.path.open("a", encoding="utf-8")
        return self._file

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
