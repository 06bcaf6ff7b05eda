"""laminar-zone lifecycle: journal recovery -> bind gRPC -> health SERVING -> READY=1 -> root tasks.

Root loops: the tick (staleness sweep), the queue pass loop, the market's
clearing rounds and the peer summary exchange. They are guarded
(:mod:`laminar_base.supervise`): one that raises is logged and restarted with
backoff; while one is down or quiet, gRPC health is NOT_SERVING and WATCHDOG=1
is held back. Signal handlers only set an event; a second signal forces exit. Shutdown: STOPPING=1 -> health NOT_SERVING -> stop accepting
(grace) -> cancel root tasks -> close the journal. Jobs and the queue stay in
the journal; running subjobs are untouched (agents own them).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import gc
import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from laminar_api.v1 import zone_pb2, zone_pb2_grpc
from laminar_base.configlib import changed_keys
from laminar_base.daemon import prepare_state_dir, serve_until_signalled
from laminar_base.errors import LaminarError
from laminar_base.grpcutil import add_health_and_reflection, server_options, set_serving
from laminar_base.metrics_http import check_metrics_exposure, start_metrics_http
from laminar_base.sdnotify import Notifier
from laminar_base.security import check_exposure, load_trust, log_trust, server_interceptors
from laminar_base.supervise import RootLoopFailed, Supervisor
from laminar_zone.audit import AUDIT_FILE, AuditLog
from laminar_zone.auth import Guard, credential_copy_warning, open_guard
from laminar_zone.config import LimitsSettings, ZoneConfig
from laminar_zone.jobs import ZoneState
from laminar_zone.limits import RateLimiter
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.peers import PeerRouter
from laminar_zone.service import ZoneControlService, ZoneService
from laminar_zone.store import JobStore

log = logging.getLogger("laminar.zone")

CONTROL_SERVICE = zone_pb2.DESCRIPTOR.services_by_name["ZoneControl"].full_name
SERVICE_NAMES = [zone_pb2.DESCRIPTOR.services_by_name["Zone"].full_name, CONTROL_SERVICE]
#: Keys SIGHUP applies to a running router; the others need a restart. The tokens file
#: named by auth.tokens_file is reread on every SIGHUP.
RELOADABLE_KEYS = frozenset(
    {
        "limits.submit_per_second",
        "limits.probe_per_second",
        "limits.burst",
        "limits.max_queued_per_tenant",
    }
)
#: Under mTLS, who may make which control call (certificate roles, docs/security.md): only
#: an agent heartbeats; only a peer zone exchanges summaries and forwards jobs.
CONTROL_ROLES = {
    f"/{CONTROL_SERVICE}/Heartbeat": {"agent"},
    f"/{CONTROL_SERVICE}/Heartbeats": {"agent"},
    f"/{CONTROL_SERVICE}/ExchangeSummary": {"peer"},
    f"/{CONTROL_SERVICE}/ForwardJob": {"peer"},
}
#: Keepalive pings on connections with a call open, and how long an answer may take.
#: (A ping costs the router about what a heartbeat does: rare, they only reap.)
KEEPALIVE_SECONDS = 120.0
KEEPALIVE_TIMEOUT_SECONDS = 20.0
#: The calls only a peer zone makes: with control.peer_secret_file they need that secret.
PEER_METHODS = [m for m, roles in CONTROL_ROLES.items() if roles == {"peer"}]


def keepalive_options() -> list[tuple[str, Any]]:
    """HTTP/2 keepalive pings from the router on connections with a call open (an agent's
    heartbeat stream), answered by the peer's gRPC core: a connection whose host vanished
    without closing it is closed, and its stream handler freed, within
    KEEPALIVE_SECONDS + KEEPALIVE_TIMEOUT_SECONDS. Staleness does not wait for that: the
    agent's silence marks it stale first (laminar_zone.membership). Pings every heartbeat
    period would bound a dead host as silence does over unary heartbeats, but they cost
    about as much as the heartbeats they replace (bench heartbeats, 256 agents)."""
    return [
        ("grpc.keepalive_time_ms", int(1000 * KEEPALIVE_SECONDS)),
        ("grpc.keepalive_timeout_ms", int(1000 * KEEPALIVE_TIMEOUT_SECONDS)),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
        # No bandwidth-delay probe pings: a heartbeat stream carries a few hundred bytes
        # now and then, and a probe per incoming message is as costly as the message
        # (bench heartbeats, 4,096 streaming agents: 0.17 -> 0.13 of a core).
        ("grpc.http2.bdp_probe", 0),
    ]


class Status(enum.Enum):
    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


#: A root loop may go this long without progress before the router counts as unhealthy
#: (longer, for a loop whose own period is longer: three periods).
QUIET_FLOOR_SECONDS = 30.0
#: A queue pass places jobs one after another, each bounded by its RPC timeouts: a long
#: queue behind slow agents may take minutes, which is not a wedge.
QUEUE_QUIET_SECONDS = 300.0
#: How often the supervisor checks the loops, flips health and feeds the watchdog.
HEALTH_CHECK_SECONDS = 1.0


class ZoneServer:
    def __init__(
        self,
        config: ZoneConfig,
        *,
        notifier: Notifier | None = None,
        reloader: Callable[[], ZoneConfig] | None = None,
    ) -> None:
        """``reloader`` loads the config again the way it was loaded at start (SIGHUP)."""
        self.config = config
        self._reloader = reloader
        #: Run as the daemon (run_until_signalled): SIGHUP reloads the config.
        self._handles_sighup = False
        self.notifier = notifier or Notifier(None)
        self.status = Status.CREATED
        self.stop_event = asyncio.Event()
        self.address = ""
        self.metrics_address = ""
        self.state: ZoneState | None = None
        self.peers: PeerRouter | None = None
        self.guard: Guard = open_guard()
        self._server: grpc.aio.Server | None = None
        self._control: ZoneControlService | None = None
        self.submitters: ZoneService | None = None
        self._metrics_http: Any = None
        self.supervisor = Supervisor(
            log,
            on_fatal=self._on_fatal,
            watchdog_interval_seconds=self.notifier.watchdog_interval_seconds,
        )

    async def start(self) -> None:
        self.status = Status.STARTING
        cfg = self.config
        trust = load_trust(cfg.tls, cfg.control)
        check_exposure(
            trust,
            cfg.server.listen,
            insecure=cfg.control.insecure,
            tokens_file=cfg.auth.tokens_file,
        )
        check_metrics_exposure(cfg.server.metrics_listen, cfg.metrics)
        state_dir = prepare_state_dir(Path(cfg.server.state_dir))
        store = JobStore(state_dir / "zone.db")
        metrics = ZoneMetrics()
        self.state = ZoneState(cfg, store, metrics, trust=trust)
        self.state.audit = AuditLog(state_dir / AUDIT_FILE)
        recovered = self.state.recover()
        log.info("journal recovery: %d live job(s) reloaded from %s", recovered, store.path)
        self.peers = PeerRouter(self.state, cfg.peers, trust.for_peers())
        self.state.forwarder = self.peers.forward
        self.state.resume_forwards(self.peers.resume_forward)
        self.guard = Guard(
            cfg.auth.tokens_file,
            submit_limiter=RateLimiter("Submit", 0.0, 1),
            probe_limiter=RateLimiter("ProbeJob", 0.0, 1),
        )
        self._apply_limits(cfg.limits)
        if self.guard.table is None:
            log.warning(
                "no auth.tokens_file: submitters are not authenticated; any caller may act on "
                "any job (fine for a local cluster, not for a shared fleet)"
            )
        else:
            log.info(
                "submitter auth on: %d token(s) from %s",
                len(self.guard.table),
                cfg.auth.tokens_file,
            )
        if self._handles_sighup:
            # Before zone.json appears: whoever waits for that file may reload at once.
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload)
        # With mTLS every caller needs a CA-signed certificate, submitters included; the
        # shared secret guards ZoneControl only (submitters use bearer tokens).
        server = grpc.aio.server(
            options=server_options(cfg.server.max_message_bytes) + keepalive_options(),
            interceptors=server_interceptors(trust, [CONTROL_SERVICE], CONTROL_ROLES, PEER_METHODS),
        )
        submitters = self.submitters = ZoneService(self.state, self.guard)
        zone_pb2_grpc.add_ZoneServicer_to_server(submitters, server)
        self._control = ZoneControlService(self.state, self.peers, submitters)
        zone_pb2_grpc.add_ZoneControlServicer_to_server(self._control, server)
        health = add_health_and_reflection(server, SERVICE_NAMES)
        port = trust.bind(server, cfg.server.listen)
        if port == 0:
            raise OSError(f"cannot bind gRPC address {cfg.server.listen}")
        host = cfg.server.listen.rpartition(":")[0]
        self.address = f"{host}:{port}"
        self.peers.address = self.address
        await server.start()
        self._server = server
        self._health = health
        await set_serving(health, SERVICE_NAMES, True)
        if cfg.server.metrics_listen:
            self._metrics_http, self.metrics_address = start_metrics_http(
                cfg.server.metrics_listen, metrics.registry, cfg.metrics, cfg.tls
            )
        self._write_addresses(state_dir)
        log.info(
            "zone %s listening on %s (metrics %s, peers %s)",
            cfg.server.zone_name,
            self.address,
            self.metrics_address or "off",
            ",".join(cfg.peers.peers) or "none",
        )
        log_trust(log, trust, "zone router", self.address)
        self._add_root_loops()
        self.supervisor.start()
        self.supervisor.start_watch(
            "zone-health",
            min(
                HEALTH_CHECK_SECONDS,
                self.notifier.watchdog_interval_seconds or HEALTH_CHECK_SECONDS,
            ),
            self._set_health,
            lambda: self.notifier.notify("WATCHDOG=1"),
        )
        self.status = Status.RUNNING
        # Start-up's objects (modules, gRPC, protobuf descriptors, the recovered journal's
        # view) into the permanent generation, as the agent does: a full collection on the
        # hot path no longer walks them (20-60 ms each, 1-5 per 1,000 launched jobs in
        # the placement bench, docs/bench-placement.md).
        gc.freeze()
        self.notifier.notify("READY=1", f"STATUS=serving on {self.address}")

    def _write_addresses(self, state_dir: Path) -> None:
        info = {
            "zone": self.config.server.zone_name,
            "address": self.address,
            "metrics_address": self.metrics_address,
            "pid": os.getpid(),
        }
        tmp = state_dir / "zone.json.tmp"
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        tmp.replace(state_dir / "zone.json")

    def _add_root_loops(self) -> None:
        assert self.state is not None and self.peers is not None
        cfg, state, peers, stop = self.config, self.state, self.peers, self.stop_event
        add = self.supervisor.add
        add("zone-tick", self._tick, quiet_seconds=QUIET_FLOOR_SECONDS)
        add(
            "zone-queue",
            lambda beat: state.run_queue(stop, beat),
            quiet_seconds=max(QUEUE_QUIET_SECONDS, 3 * cfg.queue.retry_seconds),
        )
        add(
            "zone-market",
            lambda beat: state.atomizer.run(stop, beat),
            quiet_seconds=max(QUEUE_QUIET_SECONDS, 3 * cfg.market.round_seconds),
        )
        add(
            "zone-peers",
            lambda beat: peers.run(stop, beat),
            # A pass waits a period after calls bounded by a period.
            quiet_seconds=max(QUIET_FLOOR_SECONDS, 3 * cfg.peers.exchange_seconds),
        )

    async def _set_health(self, serving: bool) -> None:
        await set_serving(self._health, SERVICE_NAMES, serving)

    def _on_fatal(self, why: str) -> None:
        """A fatal root loop failed: stop the way a signal does; the exit code says it."""
        log.critical("%s: the zone router stops (jobs stay in the journal)", why)
        self.stop_event.set()

    async def _tick(self, beat: Callable[[], None]) -> None:
        """Staleness sweep once per heartbeat period (at most 1 s)."""
        assert self.state is not None
        period = min(self.config.membership.heartbeat_seconds, 1.0)
        while not self.stop_event.is_set():
            beat()
            self.state.sweep()
            try:
                await asyncio.wait_for(self.stop_event.wait(), period)
            except TimeoutError:
                pass

    def _apply_limits(self, limits: LimitsSettings) -> None:
        """Per-tenant rate limits and the queued-job cap (at start and on SIGHUP; a reload
        starts every tenant's bucket full again)."""
        burst = limits.burst
        self.guard.submit_limiter = RateLimiter("Submit", limits.submit_per_second, burst)
        self.guard.probe_limiter = RateLimiter("ProbeJob", limits.probe_per_second, burst)
        self.guard.max_queued_per_tenant = limits.max_queued_per_tenant

    def reload(self) -> None:
        """SIGHUP (``systemctl reload``): read the config again, apply the keys that can
        change while jobs run (``limits.*``), reread the tokens file, and name the keys that
        need a restart. A config that does not load is refused with a warning and the
        running one stays; so does a broken tokens file (the old table stays). Running work,
        the queue and open connections are untouched."""
        stale = credential_copy_warning(self.guard.tokens_file)
        if stale is not None:
            log.warning("SIGHUP: %s", stale)
        if self._reloader is None:
            tokens_applied, what = self.guard.reload()
            (log.info if tokens_applied else log.warning)("SIGHUP: %s", what)
            return
        try:
            new = self._reloader()
        except LaminarError as exc:
            log.warning("SIGHUP: config not reloaded, the running one stays: %s", exc.message)
            return
        changed = changed_keys(self.config, new)
        applied = [k for k in changed if k in RELOADABLE_KEYS]
        restart = [k for k in changed if k not in RELOADABLE_KEYS]
        if applied:
            self._apply_limits(new.limits)
            self.config = dataclasses.replace(self.config, limits=new.limits)
        tokens_applied, tokens = self.guard.reload()
        (log.info if tokens_applied or not self.guard.tokens_file else log.warning)(
            "SIGHUP: config reloaded; applied %s; need a restart: %s; %s",
            ", ".join(applied) or "nothing",
            ", ".join(restart) or "nothing",
            tokens,
        )

    async def stop(self) -> None:
        self.status = Status.DRAINING
        self.notifier.notify("STOPPING=1")
        self.supervisor.begin_stop()
        if self._server is not None:
            await set_serving(self._health, SERVICE_NAMES, False)
            if self._control is not None:
                ended = self._control.end_streams()  # they would hold the grace to its end
                log.info("ended %d heartbeat stream(s) for the shutdown", ended)
            if self.submitters is not None:
                ended = self.submitters.end_streams()
                log.info("ended %d ProbeJobs and watch stream(s) for the shutdown", ended)
            await self._server.stop(self.config.server.grace_seconds)
        self.stop_event.set()
        await self.supervisor.stop()
        if self.state is not None:
            await self.state.close()
            self.state.store.close()
        if self.peers is not None:
            await self.peers.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        self.status = Status.FAILED if self.supervisor.failure else Status.STOPPED
        log.info("zone stopped")

    async def run_until_signalled(self) -> None:
        self._handles_sighup = True
        await serve_until_signalled(
            self.start, self.stop, self.stop_event, log, "jobs stay in the journal"
        )
        if self.supervisor.failure is not None:
            raise RootLoopFailed(f"{self.supervisor.failure} (its traceback is in the log)")
