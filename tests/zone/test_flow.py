"""Flow splitting, the one decision the router's PeerRouter and the simulators share:
which zone takes a fresh job."""

from __future__ import annotations

import random
import time
from pathlib import Path

from test_membership import open_state

from laminar_api.v1 import zone_pb2
from laminar_base.demand import Demand
from laminar_zone.config import PeerSettings
from laminar_zone.entry import Entry
from laminar_zone.flow import PeerSummary, split_flow
from laminar_zone.peers import LOCAL, PeerRouter
from laminar_zone.placement import ShapeCap, flow_weight

ONE_GPU = Demand(gpus=1)


def shapes(free: int) -> dict[str, ShapeCap]:
    """A zone whose hosts have ``free`` whole GPUs free."""
    return {"gpu:V100": ShapeCap(free, 64, 1000 if free else 0, 16 << 30)}


def test_weights_are_w_z_in_order_and_stale_or_unknown_peers_weigh_nothing() -> None:
    split = split_flow(
        ONE_GPU,
        ("here", shapes(2), 3.0),
        [
            PeerSummary("fresh", shapes(10), 1.0, age_seconds=1.0),
            PeerSummary("stale", shapes(50), 0.0, age_seconds=3.5),
            PeerSummary("never", None, 0.0, age_seconds=0.0),
        ],
        gamma=1.0,
        fresh_for_seconds=3.0,
        rng=random.Random(1),
    )
    assert [key for key, _ in split.weights] == ["here", "fresh", "stale", "never"]
    assert split.weights[0][1] == flow_weight(2, 3.0, 1.0) and split.weights[1][1] > 0
    assert split.weights[2:] == [("stale", 0.0), ("never", 0.0)]
    assert split.target in ("here", "fresh") and split.is_local == (split.target == "here")


def test_the_draw_follows_the_weights_and_never_picks_a_zero_weight() -> None:
    rng = random.Random(7)
    peers = [
        PeerSummary("big", shapes(30), 0.0, 0.0),
        PeerSummary("stale", shapes(60), 0.0, 99.0),
    ]
    targets = [
        split_flow(
            ONE_GPU, ("here", shapes(0), 0.0), peers, gamma=1.0, fresh_for_seconds=3.0, rng=rng
        ).target
        for _ in range(2000)
    ]
    # W_here = 1, W_big = 31: about 1 in 32 stays.
    assert "stale" not in targets
    assert 20 < targets.count("here") < 120 and targets.count("big") > 1850


def test_with_no_peer_the_job_stays() -> None:
    split = split_flow(
        ONE_GPU, ("here", {}, 5.0), [], gamma=1.0, fresh_for_seconds=3.0, rng=random.Random(1)
    )
    assert split.is_local and split.weights == [("here", flow_weight(0, 5.0, 1.0))]


async def test_the_routers_peer_router_splits_by_the_same_decision(tmp_path: Path) -> None:
    """PeerRouter keeps the summaries (their age by its clock) and asks split_flow: a
    peer whose summary went stale is never drawn, a fresh one with room is."""
    zone = open_state(tmp_path)
    try:
        router = PeerRouter(zone, PeerSettings(peers=("127.0.0.1:2", "127.0.0.1:3")))
        for address in ("127.0.0.1:2", "127.0.0.1:3"):
            summary = zone_pb2.ZoneSummary(zone=address, address=address)
            summary.shapes.add(shape="gpu:V100", free=40, total=64, max_free_milli=1000)
            router.peers[address].summary = summary
            router.peers[address].received = time.monotonic()
        stale_for = router.settings.exchange_seconds * router.settings.stale_after_periods
        router.peers["127.0.0.1:3"].received -= stale_for + 1
        entry = Entry(job=zone_pb2.Job(job_id="j1"), need=ONE_GPU)
        splits = [router.split(entry) for _ in range(200)]
        assert {s.target for s in splits} <= {LOCAL, "127.0.0.1:2"}
        assert any(s.target == "127.0.0.1:2" for s in splits)
        assert all(dict(s.weights)["127.0.0.1:3"] == 0.0 for s in splits)
    finally:
        await zone.close()
        zone.store.close()
