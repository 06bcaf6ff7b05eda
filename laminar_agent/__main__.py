"""``laminar-agent``: command line of the host daemon. Exit codes: 0 clean, 2 bad config, 1 failure."""

from __future__ import annotations

import argparse
import os
import sys

from laminar_agent.config import AgentConfig
from laminar_agent.server import AgentServer
from laminar_base.configlib import load_config
from laminar_base.daemon import run_daemon, setup_logging
from laminar_base.errors import LaminarError
from laminar_base.sdnotify import Notifier
from laminar_base.security import add_security_flags, security_overrides


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laminar-agent", description="Laminar host agent daemon")
    p.add_argument("--config", help="TOML config file")
    p.add_argument("--listen", help="gRPC HOST:PORT (port 0 picks a free port)")
    p.add_argument("--zone", help="zone router HOST:PORT")
    p.add_argument("--state-dir", help="state directory (journal, subjob logs, agent.json)")
    p.add_argument("--agent-id", help="agent identity (default: hostname)")
    p.add_argument("--gpu-backend", choices=["nvml", "fake"], help="GPU backend")
    p.add_argument("--fake-gpus", help="fake GPU spec, e.g. 4xH100-80GB")
    p.add_argument("--shared-gpus", help="GPUs open to fractional sharing: all or 0,1")
    p.add_argument("--metrics-listen", help="Prometheus HTTP HOST:PORT")
    p.add_argument(
        "--airlock-dry-run",
        action="store_true",
        default=None,
        help="Airlock records its decisions without acting (airlock.dry_run)",
    )
    p.add_argument(
        "--debug-rpcs",
        action="store_true",
        default=None,
        help="serve fault-injection calls on a real GPU backend (server.debug_rpcs)",
    )
    add_security_flags(p)
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)

    env = dict(os.environ)  # read once: a reload reads the file again, not the environment

    def load() -> AgentConfig:
        return load_config(
            AgentConfig,
            toml_path=args.config,
            env=env,
            overrides={
                "server.listen": args.listen,
                "server.state_dir": args.state_dir,
                "server.agent_id": args.agent_id,
                "server.metrics_listen": args.metrics_listen,
                "zone.zone": args.zone,
                "inventory.gpu_backend": args.gpu_backend,
                "inventory.fake_gpus": args.fake_gpus,
                "inventory.shared_gpus": args.shared_gpus,
                "airlock.dry_run": args.airlock_dry_run,
                "server.debug_rpcs": args.debug_rpcs,
                **security_overrides(args),
            },
        )

    try:
        config = load()
    except LaminarError as exc:
        print(f"laminar-agent: {exc.message}", file=sys.stderr)
        return 2
    notifier = Notifier(os.environ.get("NOTIFY_SOCKET"), os.environ.get("WATCHDOG_USEC"))
    server = AgentServer(config, notifier=notifier, reloader=load)
    return run_daemon("laminar-agent", server.run_until_signalled())


if __name__ == "__main__":
    sys.exit(main())
