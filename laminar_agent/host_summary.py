"""What the agent tells its router about its capacity: the summary every probe and release
reply carries, and with each heartbeat the windows atomized jobs bid for.

Every figure comes from the core (the ledger's free capacity and windows, the live
subjobs' states, :meth:`~laminar_agent.core.AgentCore.busy_until`); this module builds the
``AgentSummary`` message from them.
"""

from __future__ import annotations

import time

from laminar_agent.arbitration import Arbiter
from laminar_agent.carrier import Carrier
from laminar_agent.ledger import SliceKind
from laminar_api.v1 import common_pb2

_KINDS = {
    SliceKind.WHOLE_GPU: common_pb2.WHOLE_GPU,
    SliceKind.MIG: common_pb2.MIG,
    SliceKind.SHARED_GPU: common_pb2.SHARED_GPU,
}


class HostSummaries:
    """Builds this agent's summaries: ``arbiter`` counts the probes waiting for their batch;
    ``max_windows`` bounds the windows one summary advertises."""

    def __init__(
        self,
        carrier: Carrier,
        agent_id: str,
        arbiter: Arbiter,
        max_windows: int,
    ) -> None:
        self.carrier = carrier
        self.core = carrier.core
        self.agent_id = agent_id
        self.arbiter = arbiter
        self.max_windows = max_windows
        # The capacity part of the summary (host figures, each GPU's free share, shapes)
        # serialized once per ledger state: a probe batch's replies and the release after
        # a probe would otherwise build the same figures again.
        self._capacity: tuple[tuple[int, bool], bytes] | None = None

    def summary(
        self, *, with_windows: bool = False, pressured: frozenset[str] = frozenset()
    ) -> common_pb2.AgentSummary:
        """Free capacity per shape; with ``with_windows`` (heartbeats) also the windows
        atomized jobs bid for. Probe replies skip the windows: they are on the hot path.
        Slices under memory pressure (``pressured``: slice or GPU names) advertise none:
        new work there would only be Airlock's next victim."""
        self.carrier.expire()  # a summary never counts a lease that has already lapsed
        ledger = self.core.ledger
        summary = common_pb2.AgentSummary()
        summary.MergeFromString(self._capacity_bytes())
        summary.agent_id = self.agent_id
        summary.pending_probes = self.arbiter.pending_probes
        summary.active_leases = ledger.pending_leases()
        summary.draining = self.core.is_draining
        summary.pressure = common_pb2.NORMAL
        summary.generated_unix = time.time()
        summary.total_gpus = len(self.carrier.backend.gpus())
        states = list(self.core.live_states.values())
        summary.running_subjobs = states.count("RUNNING") + states.count("STARTING")
        summary.suspended_subjobs = states.count("SUSPENDED")
        if with_windows:
            self._fill_windows(summary, summary.generated_unix, pressured)
        return summary

    def _capacity_bytes(self) -> bytes:
        """The summary's capacity fields for the ledger's state, serialized (built again
        only when the state changed)."""
        ledger = self.core.ledger
        key = ledger.state_key()
        if self._capacity is not None and self._capacity[0] == key:
            return self._capacity[1]
        host = ledger.host_free()
        capacity = common_pb2.AgentSummary(
            cpu_free_milli=host.cpu_free_milli,
            cpu_total_milli=host.cpu_total_milli,
            memory_free_bytes=host.memory_free_bytes,
            memory_total_bytes=host.memory_total_bytes,
            gpu_free_milli=host.gpu_free_milli,
        )
        for shape in ledger.shapes():
            capacity.shapes.add(
                shape=shape.shape,
                free=shape.free,
                total=shape.total,
                max_free_milli=shape.max_free_milli,
                max_free_memory_bytes=shape.max_free_memory_bytes,
            )
        data = capacity.SerializeToString()
        self._capacity = (key, data)
        return data

    def _fill_windows(
        self, summary: common_pb2.AgentSummary, now_unix: float, pressured: frozenset[str]
    ) -> None:
        """The core's windows (:meth:`~laminar_agent.core.AgentCore.windows`), from the live
        subjobs' facts in memory: no journal read, no spec parsed."""
        expected = {sid: facts.expected_seconds for sid, facts in self.carrier.facts.items()}
        for w in self.core.windows(now_unix, expected, self.max_windows, pressured):
            summary.windows.add(
                agent_id=self.agent_id,
                slice_id=w.slice.slice_id,
                kind=_KINDS[w.slice.kind],
                mig_profile=w.slice.mig_profile,
                gpu_milli=w.milli,
                memory_bytes=w.memory_bytes,
                start_unix=w.start_unix,
                end_unix=w.end_unix,
                gpu_model=w.slice.gpu_model,
            )
