"""The audit log: one JSON line per statement — who, when, what, what it cost, the outcome.

It never holds a noiseless value, nor a backend error message (which may quote data).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class AuditRecord:
    analyst: str
    statement: str
    outcome: str  # "released", "answered", "rejected", "failed"
    sqlstate: str | None = None
    epsilon: float = 0.0
    delta: float = 0.0
    rows: int | None = None
    charge_id: str | None = None


class AuditLog:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: AuditRecord) -> None:
        if self.path is None:
            return
        entry: dict[str, Any] = {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                 **{k: v for k, v in record.__dict__.items() if v is not None}}
        line = json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line)
