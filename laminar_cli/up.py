"""`laminar up`: a local cluster (zone routers and agents on simulated GPUs) in the foreground."""

from __future__ import annotations

import argparse
import dataclasses
import secrets
import signal
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.table import Table

from laminar_base.errors import InvalidArgument
from laminar_base.security import write_file
from laminar_cli.cluster import LocalCluster
from laminar_cli.zoneclient import DEFAULT_ZONE, SECRET_FILE_ENV, ZONE_ENV, current_trust

#: A varied mix of hosts: MIG and whole H100s, a pair of A100s, one shared A100.
DEFAULT_FAKE_GPUS = (
    "H100-80GB:mig=3g.40gb+2g.20gb+1g.10gb,2xH100-80GB",
    "2xA100-40GB",
    "A100-80GB:shared",
)
MAX_AGENTS = 256
MAX_ZONES = 16
#: Where `laminar up --shared-secret` writes the secret, inside the state folder.
SECRET_FILE_NAME = "shared-secret"
#: How often the foreground loop checks that every daemon is still alive.
SUPERVISE_SECONDS = 0.5


def launch(
    cluster: LocalCluster,
    *,
    agents: int,
    fake_gpus: Sequence[str],
    zones: int = 1,
    listen: str = "127.0.0.1:0",
    heartbeat_seconds: float | None = None,
) -> None:
    """Start ``zones`` routers (zone 2.. peer with zone 1) and ``agents`` agents spread over them.

    Agent i is ``host-i`` on ``fake_gpus[i % len(fake_gpus)]`` and joins zone
    ``i % zones``. Returns once every router lists its agents as ready.
    """
    if not fake_gpus:
        raise InvalidArgument("give at least one spec", field="--fake-gpus")
    first = cluster.start_zone("zone-1", listen, heartbeat_seconds=heartbeat_seconds)
    for index in range(2, zones + 1):
        cluster.start_zone(
            f"zone-{index}", peers=[first.address], heartbeat_seconds=heartbeat_seconds
        )
    for index in range(agents):
        cluster.start_agent(
            f"host-{index}",
            fake_gpus[index % len(fake_gpus)],
            zone=cluster.zones[index % zones].address,
            heartbeat_seconds=heartbeat_seconds,
        )
    cluster.wait_registered()


def write_secret(path: Path) -> str:
    """A fresh random shared secret in ``path`` (mode 0600); returns it."""
    secret = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, (secret + "\n").encode(), 0o600)
    return secret


def cluster_table(cluster: LocalCluster) -> Table:
    table = Table(title="local cluster", title_justify="left")
    for column in ("daemon", "listens on", "metrics", "zone", "GPUs", "state dir"):
        table.add_column(column, no_wrap=column != "GPUs" and column != "state dir")
    names = {zone.address: zone.name for zone in cluster.zones}
    for zone in cluster.zones:
        peers = ", ".join(names.get(p, p) for p in zone.peers)
        table.add_row(
            f"router {zone.name}",
            zone.address,
            zone.metrics_address,
            f"peers: {peers}" if peers else "-",
            "",
            str(zone.state_dir),
        )
    for agent in cluster.agents:
        table.add_row(
            f"agent {agent.agent_id}",
            agent.address,
            agent.metrics_address,
            names.get(agent.zone, agent.zone),
            agent.fake_gpus,
            str(agent.state_dir),
        )
    return table


def cmd_up(args: argparse.Namespace, console: Console) -> int:
    if not 1 <= args.agents <= MAX_AGENTS:
        raise InvalidArgument(f"must be between 1 and {MAX_AGENTS}", field="--agents")
    if not 1 <= args.zones <= MAX_ZONES:
        raise InvalidArgument(f"must be between 1 and {MAX_ZONES}", field="--zones")
    stop = threading.Event()
    clusters: list[LocalCluster] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():  # a second Ctrl-C: do not wait for a graceful stop
            for cluster in clusters:
                cluster.kill()
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with tempfile.TemporaryDirectory(prefix="laminar-up-", ignore_cleanup_errors=True) as tmp:
            root = Path(args.state_dir) if args.state_dir else Path(tmp)
            env = dict(getattr(args, "security_env", {}))
            trust = current_trust()
            if args.shared_secret:
                secret_file = root / SECRET_FILE_NAME
                secret = write_secret(secret_file)
                env[SECRET_FILE_ENV] = str(secret_file.resolve())
                trust = dataclasses.replace(trust, secret=secret)
            cluster = LocalCluster(root, env=env, trust=trust)
            clusters.append(cluster)
            try:
                launch(
                    cluster,
                    agents=args.agents,
                    fake_gpus=args.fake_gpus or DEFAULT_FAKE_GPUS,
                    zones=args.zones,
                    listen=args.listen,
                )
                console.print(cluster_table(cluster))
                first = cluster.zones[0].address
                console.print(
                    f"zone router listening on {first}; try: "
                    f"{ZONE_ENV}={first} laminar agents   (Ctrl-C stops everything)",
                    highlight=False,
                )
                died = []
                while not stop.wait(SUPERVISE_SECONDS):
                    died = cluster.exited()
                    if died:
                        break
            finally:
                console.print("stopping the local cluster ...", highlight=False)
                codes = cluster.stop()
            if died:
                names = ", ".join(f"{d.name} (exit {d.process.returncode})" for d in died)
                console.print(f"stopped because a daemon exited: {names}", style="red")
                return 1
            if any(code != 0 for code in codes):
                console.print(f"daemons exited with {codes}", style="red")
                return 1
            console.print(f"all {len(codes)} daemons stopped cleanly", highlight=False)
            return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    up = sub.add_parser(
        "up",
        help="run a local cluster (router and agents on simulated GPUs) until Ctrl-C",
    )
    up.add_argument("--agents", type=int, default=3, metavar="N", help="agents (default 3)")
    up.add_argument(
        "--fake-gpus",
        action="append",
        metavar="SPEC",
        help="GPUs per agent, e.g. 4xH100-80GB or A100-80GB:shared; repeat to vary by agent "
        "(agents cycle through the specs; default a mix of MIG, whole and shared GPUs)",
    )
    up.add_argument("--zones", type=int, default=1, metavar="K", help="zone routers (default 1)")
    up.add_argument("--state-dir", help="keep state here instead of a temporary folder")
    up.add_argument(
        "--listen",
        default=DEFAULT_ZONE,
        metavar="HOST:PORT",
        help=f"first router's address (default {DEFAULT_ZONE}; port 0 picks a free port)",
    )
    up.add_argument(
        "--shared-secret",
        action="store_true",
        help=f"authenticate control calls with a fresh random secret (STATE_DIR/{SECRET_FILE_NAME})",
    )
    up.set_defaults(func=cmd_up)
