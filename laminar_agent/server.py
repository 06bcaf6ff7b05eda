"""laminar-agent lifecycle: inventory -> journal recovery -> Airlock -> bind gRPC -> health
SERVING -> READY=1 -> root loops: the tick (memory signals and the Airlock ladder every
``airlock.poll_seconds``) and, with a zone, the heartbeat.

Root loops are guarded (:mod:`laminar_base.supervise`): one that raises is logged and
restarted with backoff; while one is down or quiet, gRPC health is NOT_SERVING and
WATCHDOG=1 is held back.

Signal handlers only set an event; a second signal forces exit. Shutdown:
STOPPING=1 -> health NOT_SERVING -> stop accepting (grace) -> cancel root tasks
-> close the backend. Running subjobs are not touched by a shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import json
import logging
import os
import pwd
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from laminar_agent.cgroups import open_cgroups
from laminar_agent.config import AgentConfig, parse_uid_pool
from laminar_agent.executor import RunAs, parse_tenant_users, resolve_run_as
from laminar_agent.heartbeat import HeartbeatClient
from laminar_agent.inventory import open_backend
from laminar_agent.inventory.base import GpuBackend
from laminar_agent.inventory.cuda_checkpoint import detect_cuda_checkpoint
from laminar_agent.metrics import AgentMetrics
from laminar_agent.service import AgentService
from laminar_agent.shim import FENCE_FILE
from laminar_agent.state import AgentState
from laminar_airlock.signals import HostMemorySource
from laminar_api.v1 import agent_pb2, agent_pb2_grpc
from laminar_base.configlib import changed_keys, with_keys
from laminar_base.daemon import prepare_state_dir, serve_until_signalled
from laminar_base.errors import LaminarError
from laminar_base.grpcutil import add_health_and_reflection, server_options, set_serving
from laminar_base.metrics_http import check_metrics_exposure, start_metrics_http
from laminar_base.sdnotify import Notifier
from laminar_base.security import (
    Trust,
    check_exposure,
    load_trust,
    log_trust,
    server_interceptors,
)
from laminar_base.supervise import RootLoopFailed, Supervisor

log = logging.getLogger("laminar.agent")

SERVICE_NAME = agent_pb2.DESCRIPTOR.services_by_name["Agent"].full_name
#: Keys SIGHUP applies to a running agent; the others need a restart.
RELOADABLE_KEYS = frozenset(
    {
        "airlock.target_ratio",
        "airlock.resume_ratio",
        "airlock.readdress_after_seconds",
        "airlock.max_readdress",
        "airlock.readdress_deadline_seconds",
        "airlock.dry_run",
        "airlock.host_target_ratio",
        "airlock.release_wait_seconds",
        "airlock.predict_seconds",
        "airlock.loss_wait_ratio",
        "airlock.poll_seconds",
        "executor.tenant_users",
    }
)


#: Under mTLS, who may call what (certificate roles, see docs/security.md): routers place
#: and stop work; an operator's admin certificate reads, drains and signals; an agent or
#: a peer zone's certificate calls nothing here.
_ADMIN_METHODS = {
    "GetInventory",
    "GetSummary",
    "ListSubjobs",
    "GetSubjob",
    "WatchSubjobs",
    "ReadLogs",
    "GetAirlock",
    "Drain",
    "Undrain",
    "SignalSubjob",
    "InjectLoad",
}
AGENT_ROLES = {
    f"/{SERVICE_NAME}/{m.name}": {"router", "admin"} if m.name in _ADMIN_METHODS else {"router"}
    for m in agent_pb2.DESCRIPTOR.services_by_name["Agent"].methods
}


class Status(enum.Enum):
    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


#: A root loop may go this long without progress before the agent counts as unhealthy
#: (longer, for a loop whose own period is longer: three periods).
QUIET_FLOOR_SECONDS = 30.0
#: How often the supervisor checks the loops, flips health and feeds the watchdog.
HEALTH_CHECK_SECONDS = 1.0
TICK_LOOP = "agent-tick"


def tick_quiet_seconds(poll_seconds: float) -> float:
    """How long the tick may go without progress when it waits ``poll_seconds`` a pass:
    the floor, or three periods if longer (a reload of the period moves it too, else a
    period above the floor would hold back the watchdog and systemd would kill the agent)."""
    return max(QUIET_FLOOR_SECONDS, 3 * poll_seconds)


def prepare_agent_state_dir(state_dir: Path) -> None:
    """Create the state directory owner-only. A root agent's subjobs run as other users
    and must reach their own scratch folder below it, so there it is traverse-only for
    others (0711: nothing can be listed or read; the journal and logs inside are 0600)."""
    prepare_state_dir(state_dir, 0o711 if os.geteuid() == 0 else 0o700)
    subjobs = state_dir / "subjobs"
    subjobs.mkdir(mode=0o711, exist_ok=True)
    os.chmod(subjobs, 0o711 if os.geteuid() == 0 else 0o700)


def log_subjob_user(
    run_as: RunAs | None,
    configured: str,
    uid_pool: range | None = None,
    tenant_users: dict[str, RunAs] | None = None,
) -> None:
    """Say at start who subjob commands run as, and why."""
    me = pwd.getpwuid(os.geteuid()).pw_name if _has_user(os.geteuid()) else str(os.geteuid())
    if run_as is not None and (uid_pool is not None or tenant_users):
        log.info(
            "each tenant's subjobs run as a user of their own: %s%s; others as %s "
            "(executor.uid_pool, executor.tenant_users, executor.run_as_user)",
            f"uids {uid_pool.start}-{uid_pool.stop - 1}" if uid_pool is not None else "",
            (", " if uid_pool is not None else "")
            + ", ".join(f"{t}={u.user}" for t, u in sorted((tenant_users or {}).items())),
            run_as.user,
        )
    elif run_as is not None:
        log.warning(
            "every tenant's subjobs run as the one user %s: tenants on this host can signal "
            "and read each other's subjobs; set executor.uid_pool or executor.tenant_users",
            run_as.user,
        )
        log.info(
            "subjobs run as user %s (uid %d, gid %d, groups %s): executor.run_as_user",
            run_as.user,
            run_as.uid,
            run_as.gid,
            ",".join(str(g) for g in run_as.groups) or "none",
        )
    elif os.geteuid() == 0:
        log.warning(
            "subjobs run as root: executor.run_as_user is %r; set a user for shared hosts",
            configured,
        )
    else:
        log.info(
            "the agent is not root: subjobs run as the agent's own user %s (uid %d); "
            "executor.run_as_user applies only to an agent running as root",
            me,
            os.geteuid(),
        )


def _has_user(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


class AgentServer:
    def __init__(
        self,
        config: AgentConfig,
        *,
        notifier: Notifier | None = None,
        host_memory: HostMemorySource | None = None,
        backend: GpuBackend | None = None,
        reloader: Callable[[], AgentConfig] | None = None,
    ) -> None:
        """``host_memory`` replaces psutil as Airlock's host signal and ``backend`` the
        configured GPU backend (tests, simulation); ``reloader`` loads the config again
        the way it was loaded at start (SIGHUP)."""
        self.config = config
        self._reloader = reloader
        self._host_memory = host_memory
        self._backend = backend
        self.notifier = notifier or Notifier(None)
        self.status = Status.CREATED
        self.stop_event = asyncio.Event()
        self.address = ""
        self.metrics_address = ""
        self._server: grpc.aio.Server | None = None
        self.service: AgentService | None = None
        self._metrics_http: Any = None
        self.supervisor = Supervisor(
            log,
            on_fatal=self._on_fatal,
            watchdog_interval_seconds=self.notifier.watchdog_interval_seconds,
        )
        self._airlock_task: asyncio.Task[None] | None = None
        #: Ends the tick's wait early: a stop, or a reload that changed its period.
        self._wake_tick = asyncio.Event()
        #: Run as the daemon (run_until_signalled): SIGHUP reloads the config.
        self._handles_sighup = False
        self.state: AgentState | None = None
        self.heartbeat: HeartbeatClient | None = None
        self.trust: Trust | None = None

    async def start(self) -> None:
        self.status = Status.STARTING
        cfg = self.config
        trust = self.trust = load_trust(cfg.tls, cfg.control)
        check_exposure(trust, cfg.server.listen, insecure=cfg.control.insecure)
        check_metrics_exposure(cfg.server.metrics_listen, cfg.metrics)
        agent_id = cfg.server.agent_id or socket.gethostname()
        state_dir = Path(cfg.server.state_dir).absolute()
        prepare_agent_state_dir(state_dir)
        backend = self._backend or open_backend(
            cfg.inventory.gpu_backend,
            fake_spec=cfg.inventory.fake_gpus,
            agent_id=agent_id,
            shared_gpus=cfg.inventory.shared_gpus,
            nvml_mock=cfg.inventory.nvml_mock,
        )
        if self._backend is None and backend.name == "nvml":
            backend.cuda_checkpoint = detect_cuda_checkpoint(
                cfg.inventory.cuda_checkpoint, backend.driver_version()
            )
            log.info(
                "cuda-checkpoint: %s",
                f"{backend.cuda_checkpoint.detail}; Airlock's suspend frees GPU memory on "
                "whole GPUs"
                if backend.cuda_checkpoint.is_available
                else f"none ({backend.cuda_checkpoint.detail}); a suspended subjob keeps its "
                "GPU memory: Airlock asks for the release signal, then reclaims",
            )
        metrics = AgentMetrics()
        run_as = resolve_run_as(cfg.executor.run_as_user)
        tenant_users = parse_tenant_users(cfg.executor.tenant_users) if run_as else {}
        uid_pool = parse_uid_pool(cfg.executor.uid_pool) if run_as else None
        log_subjob_user(run_as, cfg.executor.run_as_user, uid_pool, tenant_users)
        cgroups = open_cgroups(cfg.executor.cgroup_root, agent_id) if os.geteuid() == 0 else None
        self.state = AgentState(
            agent_id,
            backend,
            metrics,
            state_dir,
            batch_seconds=cfg.arbitration.batch_seconds,
            lease_ttl_seconds=cfg.arbitration.lease_ttl_seconds,
            airlock=cfg.airlock,
            host_memory=self._host_memory,
            max_windows=cfg.zone.max_windows,
            run_as=run_as,
            tenant_users=tenant_users,
            uid_pool=uid_pool,
            cgroups=cgroups,
            mig_on_demand=cfg.inventory.mig_on_demand,
            mig_carve_busy=cfg.inventory.mig_carve_busy,
            host_totals=(cfg.inventory.host_cpu_milli, cfg.inventory.host_memory_bytes),
        )
        adopted, lost = self.state.node.recover()
        log.info("journal recovery: %d subjob(s) re-adopted, %d ended while down", adopted, lost)
        log.info(
            "agent %s: %s backend, %d GPU(s): %s",
            agent_id,
            backend.name,
            len(backend.gpus()),
            ", ".join(f"{g.index}:{g.model}" for g in backend.gpus()),
        )
        server = grpc.aio.server(
            options=server_options(cfg.server.max_message_bytes),
            interceptors=server_interceptors(trust, [SERVICE_NAME], AGENT_ROLES),
        )
        service = self.service = AgentService(self.state, debug_rpcs=cfg.server.debug_rpcs)
        agent_pb2_grpc.add_AgentServicer_to_server(service, server)
        health = add_health_and_reflection(server, [SERVICE_NAME])
        port = trust.bind(server, cfg.server.listen)
        if port == 0:
            raise OSError(f"cannot bind gRPC address {cfg.server.listen}")
        host = cfg.server.listen.rpartition(":")[0]
        self.address = f"{host}:{port}"
        self.state.address = self.address
        await server.start()
        self._server = server
        await set_serving(health, [SERVICE_NAME], True)
        self._health = health
        if cfg.server.metrics_listen:
            self._metrics_http, self.metrics_address = start_metrics_http(
                cfg.server.metrics_listen, metrics.registry, cfg.metrics, cfg.tls
            )
        if self._handles_sighup:
            # Before agent.json appears: whoever waits for that file may reload at once.
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not main thread
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload)
        self._write_addresses(state_dir, agent_id)
        log.info(
            "agent %s listening on %s (metrics %s)",
            agent_id,
            self.address,
            self.metrics_address or "off",
        )
        log_trust(log, trust, "agent", self.address)
        if cfg.server.debug_rpcs:
            log.warning("server.debug_rpcs is on: fault-injection calls (InjectLoad) are served")
        self.supervisor.add(
            TICK_LOOP, self._tick, quiet_seconds=tick_quiet_seconds(cfg.airlock.poll_seconds)
        )
        if cfg.zone.zone:
            node = self.state.node
            state = self.state
            self.heartbeat = HeartbeatClient(
                cfg.zone.zone,
                cfg.zone.heartbeat_seconds,
                lambda: state.summary_message(with_windows=True),
                node.journal,
                node.reads.event_message,
                readdress_ids=self.state.airlock.readdress_ids,
                trust=trust,
                fence_file=state_dir / FENCE_FILE,
                live_ids=lambda: sorted(node.live_states),
                on_workload=node.score_against,
                event_gap_seconds=cfg.zone.heartbeat_event_gap_seconds,
            )
            node.add_event_waiter(self.heartbeat.wake)
            heartbeat = self.heartbeat
            self.supervisor.add(
                "agent-heartbeat",
                lambda beat: heartbeat.run(self.stop_event, beat),
                # A pass waits a period and then a call of at most a period (1 s least).
                quiet_seconds=max(QUIET_FLOOR_SECONDS, 3 * cfg.zone.heartbeat_seconds + 1),
            )
        else:
            log.info("no zone router configured: running standalone")
        self.supervisor.start()
        self.supervisor.start_watch(
            "agent-health",
            min(
                HEALTH_CHECK_SECONDS,
                self.notifier.watchdog_interval_seconds or HEALTH_CHECK_SECONDS,
            ),
            self._set_health,
            lambda: self.notifier.notify("WATCHDOG=1"),
        )
        self.status = Status.RUNNING
        # Start-up's objects (modules, gRPC, protobuf descriptors, config) into the
        # permanent generation: a full collection no longer walks them (about 26 ms each,
        # one per ~1,000 launched jobs per agent, measured with gc.callbacks in the
        # placement bench). Cyclic garbage left by start-up is kept, not collected.
        gc.freeze()
        self.notifier.notify("READY=1", f"STATUS=serving on {self.address}")

    def _write_addresses(self, state_dir: Path, agent_id: str) -> None:
        info = {
            "agent_id": agent_id,
            "address": self.address,
            "metrics_address": self.metrics_address,
            "pid": os.getpid(),
        }
        tmp = state_dir / "agent.json.tmp"
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        tmp.replace(state_dir / "agent.json")

    async def _set_health(self, serving: bool) -> None:
        await set_serving(self._health, [SERVICE_NAME], serving)

    def _on_fatal(self, why: str) -> None:
        """A fatal root loop failed: stop the way a signal does; the exit code says it."""
        log.critical("%s: the agent stops (running subjobs keep running)", why)
        self.stop_event.set()

    async def _tick(self, beat: Callable[[], None]) -> None:
        """One loop: expire leases, poll memory signals, start an Airlock step; the
        supervisor feeds the systemd watchdog while this and the heartbeat make progress."""
        assert self.state is not None
        tick = self.supervisor.loops[TICK_LOOP]
        while not self.stop_event.is_set():
            beat()
            poll_seconds = self.config.airlock.poll_seconds
            # The period a reload applied: the deadline follows it from this pass on (the
            # reload raised it at once if longer, and woke this loop).
            tick.quiet_seconds = tick_quiet_seconds(poll_seconds)
            # Leases lapse on the agent's own clock, not only when a probe comes by: an
            # expired lease never holds capacity nor shows in a summary.
            self.state.node.expire_leases()
            self.state.node.set_capacity_gauges()
            # Read on a worker thread: NVML may take its deadline, the loop may not.
            readings = self.state.poll_memory(await self.state.read_memory())
            airlock = self.state.airlock
            if self.state.node.live_states and not airlock.is_busy:
                self._airlock_task = asyncio.create_task(
                    airlock.step_logged(readings, self.state.host_sample, self.state.host_level),
                    name="airlock-step",
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_tick.wait(), poll_seconds)
            self._wake_tick.clear()

    async def stop(self) -> None:
        self.status = Status.DRAINING
        self.notifier.notify("STOPPING=1")
        self.supervisor.begin_stop()
        if self._server is not None:
            await set_serving(self._health, [SERVICE_NAME], False)
            if self.service is not None:
                ended = self.service.end_streams()  # they would hold the grace to its end
                log.info("ended %d call and watch stream(s) for the shutdown", ended)
            await self._server.stop(self.config.server.grace_seconds)
            if self.service is not None:
                cut = await self.service.calls_finished(self.config.server.grace_seconds)
                if cut:
                    log.warning("%d call(s) of a gone stream cut short by the shutdown", cut)
        self.stop_event.set()
        self._wake_tick.set()
        await self.supervisor.stop()
        if self._airlock_task is not None:
            self._airlock_task.cancel()
            await asyncio.gather(self._airlock_task, return_exceptions=True)
        if self.state is not None:
            await self.state.airlock.close()
        if self._metrics_http is not None:
            await asyncio.to_thread(self._metrics_http.shutdown)  # blocks up to its poll interval
        if self.state is not None:
            await self.state.node.close()
            await asyncio.to_thread(self.state.backend.close)
        self.status = Status.FAILED if self.supervisor.failure else Status.STOPPED
        log.info("agent stopped")

    async def run_until_signalled(self) -> None:
        self._handles_sighup = True
        await serve_until_signalled(
            self.start, self.stop, self.stop_event, log, "running subjobs keep running"
        )
        if self.supervisor.failure is not None:
            raise RootLoopFailed(f"{self.supervisor.failure} (its traceback is in the log)")

    def reload(self) -> None:
        """SIGHUP (``systemctl reload``): read the config again, apply the keys that can
        change while subjobs run (:data:`RELOADABLE_KEYS`: the Airlock ladder's policy
        keys, ``airlock.dry_run``, ``airlock.poll_seconds``, ``executor.tenant_users``) and
        name the ones that need a restart. Only the applied keys become the running config,
        so a key that needs a restart is named again at every reload until the restart. A
        config that does not load is refused with a warning; the running one stays."""
        if self._reloader is None or self.state is None:
            log.info("SIGHUP: nothing to reload (no config loader)")
            return
        try:
            new = self._reloader()
            users = (
                parse_tenant_users(new.executor.tenant_users)
                if self.state.node.executor.run_as is not None
                else {}
            )
        except LaminarError as exc:
            log.warning("SIGHUP: config not reloaded, the running one stays: %s", exc.message)
            return
        changed = changed_keys(self.config, new)
        applied = [k for k in changed if k in RELOADABLE_KEYS]
        restart = [k for k in changed if k not in RELOADABLE_KEYS]
        self.config = with_keys(self.config, new, applied)
        airlock = self.config.airlock
        if any(k.startswith("airlock.") for k in applied):
            self.state.airlock.config = airlock.policy_config()
            self.state.node.arbiter.airlock_dry_run = airlock.dry_run
        if "airlock.poll_seconds" in applied and TICK_LOOP in self.supervisor.loops:
            # The deadline is raised now for a longer period (the tick's next wait is the
            # new one); the tick, woken to start it, sets it for a shorter one.
            tick = self.supervisor.loops[TICK_LOOP]
            tick.quiet_seconds = max(tick.quiet_seconds, tick_quiet_seconds(airlock.poll_seconds))
            self._wake_tick.set()
        if "executor.tenant_users" in applied:
            self.state.node.executor.identities.users = users
        log.info(
            "SIGHUP: config reloaded; applied %s; need a restart: %s",
            ", ".join(applied) or "nothing",
            ", ".join(restart) or "nothing",
        )
