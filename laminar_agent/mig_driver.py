"""MIG on demand, the driver's half: the backend creates the layouts the ledger chose.

The ledger decides which MIG GPU gets which new layout (:mod:`laminar_agent.mig_layout`,
:attr:`~laminar_agent.ledger.Ledger.mig_pending`); this module applies a pending layout
before the first commit on that GPU, journals it so that a restarted agent gives each GPU
its layout back, and names the new instances' devices for the API.
"""

from __future__ import annotations

import asyncio
import json
import logging

from laminar_agent.carrier import Carrier
from laminar_agent.inventory import GpuBackend
from laminar_agent.inventory.base import MigInstanceInfo, MigRepartitioner
from laminar_agent.journal import Journal
from laminar_agent.mig_layout import MigGpu
from laminar_base.errors import InvalidArgument

log = logging.getLogger("laminar.agent.node")

#: Journal meta key: GPU index -> the MIG layout last applied on demand (JSON).
MIG_LAYOUTS_META = "mig_layouts"


def restore_mig_layouts(journal: Journal, backend: GpuBackend) -> list[MigGpu]:
    """MIG on demand: the GPUs the ledger may repartition, after giving each the layout
    journaled when it was last applied (the fake backend starts from its spec; a real
    GPU keeps its instances, and applying the same layout again changes nothing)."""
    if not isinstance(backend, MigRepartitioner):
        raise InvalidArgument(
            f"MIG on demand needs a backend that creates GPU instances ({backend.name} does not)",
            field="inventory.mig_on_demand",
        )
    saved: dict[str, list[list[object]]] = json.loads(journal.get_meta(MIG_LAYOUTS_META) or "{}")
    for index, layout in sorted(saved.items()):
        backend.apply_mig_layout(
            int(index), [(str(n), int(str(a)), int(str(z))) for n, a, z in layout]
        )
    return [MigGpu(g.index, g.model, g.uuid) for g in backend.gpus() if g.mig_enabled]


class MigLayouts:
    """Applies the layouts a lease's commit needs, one repartition at a time."""

    def __init__(self, carrier: Carrier) -> None:
        self.carrier = carrier
        self._lock = asyncio.Lock()

    async def apply_for(self, lease_id: str) -> None:
        """Before a lease on a MIG GPU whose new layout the ledger chose is committed, the
        backend creates that layout (only instances the ledger holds idle are destroyed,
        and the backend refuses where one runs something); the layout is journaled for
        restarts. The driver's calls run off the event loop, one repartition at a time."""
        ledger = self.carrier.core.ledger
        lease = ledger.lease(lease_id)
        backend = self.carrier.backend
        if lease is None or not ledger.mig_pending or not isinstance(backend, MigRepartitioner):
            return
        indexes = {
            ledger.slices[a.slice_id].gpu_index
            for a in lease.allocations
            if a.slice_id in ledger.slices
        }
        async with self._lock:
            for index in sorted(indexes & set(ledger.mig_pending)):
                layout = ledger.mig_pending.get(index)
                if layout is None:
                    continue  # another commit applied it while we waited
                instances = await asyncio.to_thread(backend.apply_mig_layout, index, layout)
                self._applied(index, layout, instances, lease_id)

    def _applied(
        self,
        index: int,
        layout: tuple[tuple[str, int, int], ...],
        instances: tuple[MigInstanceInfo, ...],
        lease_id: str,
    ) -> None:
        """Record a layout the backend applied: ledger, journal, device names."""
        self.carrier.core.ledger.layout_applied(index, instances)
        journal = self.carrier.journal
        saved = json.loads(journal.get_meta(MIG_LAYOUTS_META) or "{}")
        saved[str(index)] = [list(instance) for instance in layout]
        journal.set_meta(MIG_LAYOUTS_META, json.dumps(saved, sort_keys=True))
        for inst in instances:
            slice_id = f"gpu{index}/{inst.profile}@{inst.start}"
            self.carrier.devices[slice_id] = inst.uuid
            self.carrier.slice_names[inst.uuid] = slice_id
        log.info(
            "GPU %d repartitioned to %s for lease %s",
            index,
            "+".join(name for name, _, _ in layout),
            lease_id,
        )
