"""Counts what the router does per job in a bench run: journal commits, saves (grouped or
not), the calls it serves and the messages its job streams send (WatchJob, SubmitAndWatch), its calls to agents and the
heartbeats it takes. Load-independent figures, where CPU per job is noisy on a shared
machine.

Put this directory first on ``PYTHONPATH`` with ``LAMINAR_COUNTS_OUT`` naming a file: in
the router's process only (``laminar_zone`` in its command line) the counts are kept and
written there as JSON at exit. Nothing else changes, though the SQLite trace callback and
the wrappers add CPU of their own: take CPU figures from runs without it.

    cd /tmp && LAMINAR_COUNTS_OUT=/tmp/counts.json PYTHONPATH=/path/to/bench/router_counts:/path/to/tree \
        python -m laminar_bench placement --agents 4 --jobs 300 --launch -o json
"""

from __future__ import annotations

import os
import sys

if any("laminar_zone" in a for a in sys.orig_argv) and os.environ.get("LAMINAR_COUNTS_OUT"):
    import atexit
    import collections
    import functools
    import inspect
    import json
    import sqlite3
    from typing import Any

    counts: collections.Counter[str] = collections.Counter()
    _connect = sqlite3.connect

    def _counting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = _connect(*args, **kwargs)

        def traced(sql: str) -> None:
            head = sql.lstrip()[:6].upper()
            if head.startswith("COMMIT"):
                counts["journal_commits"] += 1
            elif head in ("INSERT", "UPDATE", "DELETE") and not conn.in_transaction:
                counts["journal_commits"] += 1  # autocommit: its own transaction

        conn.set_trace_callback(traced)
        return conn

    sqlite3.connect = _counting_connect  # type: ignore[assignment]

    def _count_calls(cls: Any, name: str, key: str) -> None:
        method = getattr(cls, name)

        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return method(*args, **kwargs)

        @functools.wraps(method)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return await method(*args, **kwargs)

        # grpc.aio awaits a handler only if it is a coroutine function.
        setattr(cls, name, async_wrapper if inspect.iscoroutinefunction(method) else wrapper)

    def _count_stream(cls: Any, name: str) -> None:
        """Count calls of a server-streaming handler and the messages it sends."""
        method = getattr(cls, name)

        @functools.wraps(method)
        async def counted(*args: Any, **kwargs: Any) -> Any:
            counts[f"served.{name}"] += 1
            async for event in method(*args, **kwargs):
                counts["watch_messages"] += 1
                yield event

        setattr(cls, name, counted)

    def _install() -> None:
        import grpc.aio._channel as channel

        from laminar_zone import persistence, reports, service

        for kind in ("UnaryUnaryMultiCallable", "UnaryStreamMultiCallable"):
            _count_calls(getattr(channel, kind), "__call__", "calls_to_agents")
        for name in ("Submit", "SubmitBatch", "GetJob", "ProbeJob", "CommitJob", "CancelJob"):
            _count_calls(service.ZoneService, name, f"served.{name}")
        _count_calls(reports.AgentReports, "on_heartbeat", "heartbeats")
        for name in ("WatchJob", "SubmitAndWatch"):
            _count_stream(service.ZoneService, name)
        save_many = persistence.Persistence.save_many

        @functools.wraps(save_many)
        def counted_save(self: Any, entries: Any, **kwargs: Any) -> Any:
            counts["saves.grouped" if kwargs.get("grouped") else "saves"] += 1
            return save_many(self, entries, **kwargs)

        persistence.Persistence.save_many = counted_save  # type: ignore[method-assign]

    _install()

    def _dump() -> None:
        with open(os.environ["LAMINAR_COUNTS_OUT"], "w") as out:
            json.dump(dict(counts), out, indent=1, sort_keys=True)

    atexit.register(_dump)
