"""``laminar-zone``: command line of the zone router. Exit codes: 0 clean, 2 bad config, 1 failure."""

from __future__ import annotations

import argparse
import os
import sys

from laminar_base.configlib import load_config
from laminar_base.daemon import run_daemon, setup_logging
from laminar_base.errors import LaminarError
from laminar_base.sdnotify import Notifier
from laminar_base.security import add_security_flags, security_overrides
from laminar_zone.config import ZoneConfig
from laminar_zone.server import ZoneServer


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laminar-zone", description="Laminar zone router daemon")
    p.add_argument("--config", help="TOML config file")
    p.add_argument("--listen", help="gRPC HOST:PORT (port 0 picks a free port)")
    p.add_argument("--state-dir", help="state directory (zone.db journal, zone.json)")
    p.add_argument("--zone-name", help="this zone's name")
    p.add_argument("--peers", help="peer zone routers HOST:PORT,...")
    p.add_argument("--metrics-listen", help="Prometheus HTTP HOST:PORT")
    p.add_argument("--heartbeat-seconds", help="heartbeat period asked of agents, e.g. 1s")
    add_security_flags(p)
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    env = dict(os.environ)  # read once: a reload reads the file again, not the environment

    def load() -> ZoneConfig:
        return load_config(
            ZoneConfig,
            toml_path=args.config,
            env=env,
            overrides={
                "server.listen": args.listen,
                "server.state_dir": args.state_dir,
                "server.zone_name": args.zone_name,
                "server.metrics_listen": args.metrics_listen,
                "peers.peers": args.peers,
                "membership.heartbeat_seconds": args.heartbeat_seconds,
                **security_overrides(args),
            },
        )

    try:
        config = load()
    except LaminarError as exc:
        print(f"laminar-zone: {exc.message}", file=sys.stderr)
        return 2
    notifier = Notifier(os.environ.get("NOTIFY_SOCKET"), os.environ.get("WATCHDOG_USEC"))
    return run_daemon(
        "laminar-zone", ZoneServer(config, notifier=notifier, reloader=load).run_until_signalled()
    )


if __name__ == "__main__":
    sys.exit(main())
