"""One class order in the router's market: a blocked rigid job holds a slice's window only
against its own class and the lower ones (issue 17)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from laminar_api.v1 import common_pb2
from laminar_base.demand import Demand
from laminar_zone.atomizer import Atomizer
from laminar_zone.config import ZoneConfig

GIB = 1 << 30
NOW = 1000.0


def atomizer(blocked: dict[str, tuple[int, float]]) -> Atomizer:
    zone = SimpleNamespace(config=ZoneConfig(), blocked_starts=blocked)
    return Atomizer(cast(Any, zone))


def mig(profile: str) -> common_pb2.Window:
    return common_pb2.Window(
        agent_id="a", slice_id=f"gpu1/{profile}@0", kind=common_pb2.MIG, mig_profile=profile,
        gpu_milli=1000, memory_bytes=40 * GIB,
    )  # fmt: skip


def test_a_blocked_batch_job_cuts_batch_and_opportunistic_windows_not_production() -> None:
    family = Demand(gpus=0, mig_profile="3g.40gb").family
    market = atomizer({family: (common_pb2.BATCH, NOW + 120.0)})
    window = mig("3g.40gb")
    cap = ZoneConfig().market.max_window_seconds
    assert market.offer_length(NOW, window, 0.0, common_pb2.PRODUCTION) == cap
    assert market.offer_length(NOW, window, 0.0, common_pb2.BATCH) == 120.0
    assert market.offer_length(NOW, window, 0.0, common_pb2.OPPORTUNISTIC) == 120.0
    assert market.offer_length(NOW, window, 0.0, None) == 120.0  # announced: any class's
    # Another family's windows are not held for it; a window's own end still bounds it.
    assert market.offer_length(NOW, mig("4g.40gb"), 0.0, common_pb2.BATCH) == cap
    assert market.offer_length(NOW, window, NOW + 60.0, common_pb2.PRODUCTION) == 60.0
