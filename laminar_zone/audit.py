"""The router's audit log: one JSON line per administrative or destructive action.

``STATE_DIR/audit.jsonl`` is only ever appended to (opened in append mode, each
line flushed and fsync'd before the call returns), so an operator can ship it,
``tail -f`` it or read it with ``jq``. Each line has ``at_unix``, ``actor`` (the
caller's tenant and role, ``anonymous`` with auth off, or ``airlock@AGENT`` for what
an agent did on its own), ``action`` (cancel, drain, undrain, inject_pressure,
preemption, reclamation), ``target`` and ``reason``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

AUDIT_FILE = "audit.jsonl"


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def append(self, actor: str, action: str, target: str, reason: str, **extra: Any) -> None:
        line = json.dumps(
            {
                "at_unix": round(time.time(), 3),
                "actor": actor,
                "action": action,
                "target": target,
                "reason": reason,
                **extra,
            },
            sort_keys=True,
        )
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        with self._lock, os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def read(self) -> list[dict[str, Any]]:
        """Every entry, oldest first (for tests and small tools)."""
        if not self.path.exists():
            return []
        with self.path.open(encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
