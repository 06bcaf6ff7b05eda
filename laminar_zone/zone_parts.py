"""What the router's state gives its drivers, as a Protocol.

:class:`laminar_zone.jobs.ZoneState` builds its drivers (``admission.py``, ``try_driver.py``,
``queue_loop.py``, ``persistence.py``) and hands each itself. The drivers name it by
:class:`ZoneParts`, not by ``ZoneState``, so none of them imports ``jobs.py`` (which imports
them): no import cycle, type-checking imports included (``tests/test_import_cycles.py``).
Every member is a read-only property, so ``ZoneState``'s plain attributes satisfy it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from laminar_api.v1 import zone_pb2
from laminar_zone.atomizer import Atomizer
from laminar_zone.config import ZoneConfig
from laminar_zone.core import Instruction, ZoneCore
from laminar_zone.entry import Entry
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.placer import AgentClients, Placer
from laminar_zone.store import JobStore
from laminar_zone.usage import UsageLedger
from laminar_zone.view import ZoneView

T = TypeVar("T")


class TryStarts(Protocol):
    """The try driver as a queue pass asks it to start a job."""

    async def start_from_pass(self, entry: Entry) -> tuple[bool, asyncio.Task[bool]]: ...


class Journaling(Protocol):
    """The journal's side as the drivers use it: the gauges a queue pass refreshes, and
    Submit's group commit (:class:`laminar_zone.persistence.Persistence`)."""

    def update_gauges(self, *, force: bool = False) -> None: ...

    def journal_new(self, jobs: Sequence[zone_pb2.Job]) -> asyncio.Future[None]: ...

    def new_by_request(self, tenant: str, client_request_id: str) -> zone_pb2.Job | None: ...


class ZoneParts(Protocol):
    """The router's state as its drivers use it (:class:`laminar_zone.jobs.ZoneState`)."""

    @property
    def config(self) -> ZoneConfig: ...
    @property
    def zone_name(self) -> str: ...
    @property
    def store(self) -> JobStore: ...
    @property
    def metrics(self) -> ZoneMetrics: ...
    @property
    def rng(self) -> random.Random: ...
    @property
    def view(self) -> ZoneView: ...
    @property
    def usage_ledger(self) -> UsageLedger: ...
    @property
    def clients(self) -> AgentClients: ...
    @property
    def placer(self) -> Placer: ...
    @property
    def shares(self) -> dict[str, float]: ...
    @property
    def atomizer(self) -> Atomizer: ...
    @property
    def core(self) -> ZoneCore: ...
    @property
    def entries(self) -> dict[str, Entry]: ...
    @property
    def array_watchers(self) -> dict[str, list[asyncio.Queue[zone_pb2.Job]]]: ...
    @property
    def queue_wake(self) -> asyncio.Event: ...
    @property
    def forwarder(self) -> Callable[[Entry], Coroutine[Any, Any, bool]] | None: ...
    @property
    def tries(self) -> TryStarts: ...
    @property
    def persistence(self) -> Journaling: ...

    def _do(self, instructions: Sequence[Instruction]) -> None: ...

    async def _run(self, instructions: Sequence[Instruction]) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]: ...

    async def queue_pass(self) -> None: ...

    def forget_if_done(self, entry: Entry) -> None: ...
