"""Flow splitting across zones: exchange zone summaries, forward a job at most once.

Each router sends its zone summary (free capacity per shape over fresh
agents, heat = pending probes + leases + placements in flight) to its peers
every period and keeps theirs. A new job goes to zone z with probability
proportional to ``W_z = (1 + S_z) / (1 + H_z)^gamma``, where S_z is the free
capacity of z that fits the job's shape; a summary older than
``stale_after_periods`` periods weighs 0. A forwarded job is never forwarded
again, and forwarding is exactly once: see :meth:`PeerRouter.forward`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from laminar_api.v1 import zone_pb2, zone_pb2_grpc
from laminar_base.errors import ResourceExhausted
from laminar_base.security import INSECURE, Trust
from laminar_base.wire import workload_counts, workload_message
from laminar_zone.config import PeerSettings
from laminar_zone.entry import Entry
from laminar_zone.flow import PeerSummary, Split, split_flow
from laminar_zone.jobs import ZoneState
from laminar_zone.placement import ShapeCap
from laminar_zone.placer import StubCache, shapes_from

log = logging.getLogger("laminar.zone.peers")

#: Most peer zones one router exchanges summaries with (configured and learnt).
MAX_PEERS = 64

LOCAL = "local"
#: ``Job.forwarded_to`` of a forward sent but not yet answered: ``pending:ADDRESS``.
PENDING_FORWARD = "pending:"
FORWARD_RETRY_FIRST_SECONDS = 0.2
FORWARD_RETRY_MAX_SECONDS = 5.0


def _is_ambiguous(exc: grpc.aio.AioRpcError) -> bool:
    """Whether the peer may have taken the job although the call failed. A refusal is a
    definite answer; UNAVAILABLE before any connection means the request never left."""
    code = exc.code()
    if code in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.NOT_FOUND,
    ):
        return False
    if code == grpc.StatusCode.UNAVAILABLE:
        details = (exc.details() or "").lower()
        return not any(
            hint in details
            for hint in ("failed to connect", "connection refused", "connect failed", "dns")
        )
    return True


@dataclass
class Peer:
    address: str
    summary: zone_pb2.ZoneSummary | None = None
    received: float = 0.0  # monotonic
    failures: int = 0


class PeerRouter:
    def __init__(self, state: ZoneState, settings: PeerSettings, trust: Trust = INSECURE) -> None:
        self.state = state
        self.settings = settings
        self.address = ""
        self.peers: dict[str, Peer] = {a: Peer(a) for a in settings.peers}
        self._stubs: StubCache[zone_pb2_grpc.ZoneControlAsyncStub] = StubCache(
            zone_pb2_grpc.ZoneControlStub, trust
        )
        self._local: dict[str, ShapeCap] = {}

    # ------------------------------------------------------------- summaries

    def local_summary(self) -> zone_pb2.ZoneSummary:
        """Free capacity per shape summed over ready agents (O(agents), once a period)."""
        agents, totals = self.state.view.shape_totals()
        summary = zone_pb2.ZoneSummary(
            zone=self.state.zone_name,
            address=self.address,
            heat=self.state.view.heat() + self.state.placer.in_flight,
            agents=agents,
            queued_jobs=sum(
                1 for e in self.state.entries.values() if e.job.state == zone_pb2.QUEUED
            ),
            generated_unix=time.time(),
        )
        for shape, cap in totals.items():
            summary.shapes.add(
                shape=shape,
                free=cap.free,
                total=cap.total,
                max_free_milli=cap.max_free_milli,
                max_free_memory_bytes=cap.max_free_memory_bytes,
            )
        summary.workload.extend(workload_message(self.state.placer.workload.own))
        self._local = shapes_from_zone(summary)
        return summary

    def _learn_workload(self, summary: zone_pb2.ZoneSummary) -> None:
        """A peer's own observed task shapes join this router's target workload."""
        if summary.zone and summary.zone != self.state.zone_name:
            self.state.placer.workload.note_peer(summary.zone, workload_counts(summary.workload))

    def accept(self, summary: zone_pb2.ZoneSummary) -> zone_pb2.ZoneSummary:
        """ExchangeSummary from a peer: remember it (learning new peers) and answer with ours."""
        if summary.address and summary.address != self.address:
            if summary.address not in self.peers and len(self.peers) >= MAX_PEERS:
                # Every peer is dialled each exchange period: a caller must not grow the set.
                raise ResourceExhausted(
                    f"this router already exchanges with {len(self.peers)} peer zones, "
                    f"at most {MAX_PEERS}",
                    field="address",
                )
            peer = self.peers.setdefault(summary.address, Peer(summary.address))
            if peer.summary is None:
                log.info("peer zone %s at %s joined", summary.zone, summary.address)
            peer.summary = summary
            peer.received = time.monotonic()
            self._learn_workload(summary)
        return self.local_summary()

    async def run(self, stop: asyncio.Event, beat: Callable[[], None] = lambda: None) -> None:
        """Exchange summaries with every peer each period; ``beat`` once per pass. With no
        peer (yet), nothing is summed: the summary walks every agent and job, and a peer
        that calls in gets one made for it (:meth:`accept`)."""
        while not stop.is_set():
            beat()
            if self.peers:
                mine = self.local_summary()
                await asyncio.gather(
                    *(self._exchange(peer, mine) for peer in list(self.peers.values())),
                    return_exceptions=True,
                )
            try:
                await asyncio.wait_for(stop.wait(), self.settings.exchange_seconds)
            except TimeoutError:
                pass

    async def _exchange(self, peer: Peer, mine: zone_pb2.ZoneSummary) -> None:
        try:
            theirs = await self._stub(peer.address).ExchangeSummary(
                mine, timeout=self.settings.exchange_seconds
            )
        except grpc.aio.AioRpcError as exc:
            peer.failures += 1
            if peer.failures in (1, 10) or peer.failures % 100 == 0:
                log.warning(
                    "summary exchange with peer %s failed (%d in a row): %s",
                    peer.address,
                    peer.failures,
                    exc.code().name,
                )
            return
        peer.failures = 0
        peer.summary = theirs
        peer.received = time.monotonic()
        self._learn_workload(theirs)

    def _stub(self, address: str) -> zone_pb2_grpc.ZoneControlAsyncStub:
        return self._stubs.stub(address)

    # ------------------------------------------------------------- splitting

    def split(self, entry: Entry) -> Split:
        """Where ``entry`` goes by flow splitting (:func:`laminar_zone.flow.split_flow`)
        over this zone and the peers' summaries as they stand now."""
        now = time.monotonic()
        local_heat = self.state.view.heat() + self.state.placer.in_flight
        peers = [
            PeerSummary(
                peer.address,
                shapes_from_zone(peer.summary) if peer.summary is not None else None,
                peer.summary.heat if peer.summary is not None else 0.0,
                now - peer.received,
            )
            for peer in self.peers.values()
        ]
        return split_flow(
            entry.need,
            (LOCAL, self._local, local_heat),
            peers,
            gamma=self.settings.gamma,
            fresh_for_seconds=self.settings.exchange_seconds * self.settings.stale_after_periods,
            rng=self.state.rng,
        )

    async def forward(self, entry: Entry) -> bool:
        """Maybe send a fresh job to a peer; True when a peer took it (recorded FORWARDED).

        Exactly once: the request carries an idempotency key (``fwd:ZONE:JOB``) that the
        peer journals with the job, so resending it can never make a second job. Only the
        peer's answer decides: a definite refusal, or a connection that never opened,
        places the job here; an ambiguous failure (a deadline, a connection lost mid-call)
        is retried with the same key until the peer answers, and the pending target is
        journaled first so a router restart resumes the forward instead of placing it."""
        if not self.peers:
            return False
        split = self.split(entry)
        if split.is_local:
            return False
        target, weights = split.target, split.weights
        job = entry.job
        job.forwarded_to = PENDING_FORWARD + target
        job.reason = f"forwarding to zone at {target}"
        self.state.save(entry)
        return await self.resume_forward(entry, target, weights)

    async def resume_forward(
        self,
        entry: Entry,
        target: str,
        weights: list[tuple[str, float]] | None = None,
    ) -> bool:
        """Send (again) the forward of ``entry`` to ``target`` until the peer answers."""
        job = entry.job
        request = zone_pb2.ForwardJobRequest(
            spec=job.spec,
            client_request_id=f"fwd:{self.state.zone_name}:{job.job_id}",
            from_zone=self.state.zone_name,
            origin_job_id=job.job_id,
        )
        metadata = (("authorization", f"Bearer {entry.bearer}"),) if entry.bearer else None
        delay = FORWARD_RETRY_FIRST_SECONDS
        tries = 0
        while True:
            tries += 1
            try:
                remote = await self._stub(target).ForwardJob(
                    request,
                    timeout=self.state.config.placement.rpc_timeout_seconds,
                    metadata=metadata,
                )
                break
            except grpc.aio.AioRpcError as exc:
                if not _is_ambiguous(exc):
                    log.warning(
                        "forwarding job %s to %s refused or never sent (%s); placing it here",
                        job.job_id,
                        target,
                        exc.code().name,
                    )
                    job.forwarded_to = ""
                    job.reason = "placing"
                    self.state.save(entry)
                    return False
                if tries in (1, 10) or tries % 100 == 0:
                    log.warning(
                        "forwarding job %s to %s unconfirmed (%s, try %d): retrying with the "
                        "same idempotency key",
                        job.job_id,
                        target,
                        exc.code().name,
                        tries,
                    )
                job.reason = (
                    f"forwarding to zone at {target} unconfirmed ({exc.code().name}); retrying"
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, FORWARD_RETRY_MAX_SECONDS)
        peer = self.peers.get(target)
        zone = peer.summary.zone if peer is not None and peer.summary else target
        self.state.core.set_state(entry, zone_pb2.FORWARDED)
        job.forwarded_to = f"{zone}@{target}/{remote.job_id}"
        job.reason = f"forwarded to zone {zone} at {target} as job {remote.job_id}" + (
            f" (weights {', '.join(f'{k}={w:.2f}' for k, w in weights)})" if weights else ""
        )
        job.ended_unix = time.time()
        self.state.metrics.forwarded.inc()
        self.state.save(entry)
        return True

    async def close(self) -> None:
        await self._stubs.close()


def shapes_from_zone(summary: zone_pb2.ZoneSummary) -> dict[str, ShapeCap]:
    return shapes_from(summary)  # type: ignore[arg-type]


def parse_forwarded(forwarded_to: str) -> tuple[str, str, str]:
    """``zone@HOST:PORT/JOB`` -> (zone, address, remote job id)."""
    zone, _, rest = forwarded_to.partition("@")
    address, _, job_id = rest.rpartition("/")
    return zone, address, job_id
