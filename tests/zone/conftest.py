"""Zone tests: a real laminar-zone process and real agent processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from zonekit import HEARTBEAT_SECONDS, Zone, open_zone

from laminar_cli.cluster import LocalCluster


@pytest.fixture(scope="module")
def zone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zone]:
    """One router with three agents: 2 whole GPUs, a MIG GPU, a shared GPU."""
    root = tmp_path_factory.mktemp("zone")
    with LocalCluster(root) as cluster:
        z = open_zone(cluster, root)
        cluster.start_agent(
            "whole", "2xH100-80GB", zone=z.address, heartbeat_seconds=HEARTBEAT_SECONDS
        )
        cluster.start_agent(
            "mig",
            "H100-80GB:mig=3g.40gb+2g.20gb+1g.10gb",
            zone=z.address,
            heartbeat_seconds=HEARTBEAT_SECONDS,
        )
        cluster.start_agent(
            "share", "A100-80GB:shared", zone=z.address, heartbeat_seconds=HEARTBEAT_SECONDS
        )
        cluster.wait_registered()
        yield z
        z.channel.close()
