"""Real-GPU check of an agent host (run as root on a host with an NVIDIA GPU and PyTorch).

What the test suite can only do over the mocked NVML, on the real thing:

1. **NVML backend**: the agent's ``NvmlBackend`` reads the GPUs, their memory and the
   driver; ``memory_used`` (what Airlock polls) is timed over 200 calls.
2. **cuda-checkpoint**: the agent's own detection (``inventory.cuda_checkpoint``) of the
   binary on PATH and of the driver branch.
3. **Airlock under real GPU-memory pressure**: one real agent on ``--gpu-backend nvml``
   with GPU 0 shared, two real subjobs (production and opportunistic, PyTorch processes
   that each fill ``--job-gib`` of GPU memory with a known pattern and keep computing on
   it), then a process outside the agent takes enough memory to put the GPU above the
   critical mark. Expected: the opportunistic subjob is suspended through cuda-checkpoint
   (its memory leaves the GPU), nothing dies of CUDA OOM, the production subjob keeps
   running; the pressure goes, the suspended subjob resumes with its memory, and both
   check their pattern and succeed. Reaction, suspend and resume times are reported.
4. **An upgrade while a subjob is checkpointed** (``--restart``, on by default): with the
   opportunistic subjob suspended and the pressure still there, the agent is stopped
   (SIGTERM) and started again on its state directory. Expected: the restarted agent keeps
   the subjob suspended (it counts the bytes its checkpoint holds, though NVML reads 0 for
   it), and once the pressure goes it resumes it *and* restores its CUDA state (the
   restore counter goes to 1; a continued process whose state stayed on the host would
   wait in its next CUDA call forever), and the pattern survives.

Writes one JSON report (``--out``) and prints it; exits 0 unless the host has no GPU.
``python3 bench/gpu_check.py --out report.json`` from the repository root.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from laminar_api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from laminar_cli.cluster import LocalCluster

GIB = 1 << 30

#: A subjob: fill GIB of GPU memory with a pattern, write its pid, compute until the gate
#: file appears, then check the pattern survived (exit 3 if not).
JOB = """
import os, pathlib, sys, time
import torch
gib, pid_file, gate, beat = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
x = torch.full((int(gib * (1 << 30)) // 4,), 7.0, dtype=torch.float32, device="cuda")
torch.cuda.synchronize()
pathlib.Path(pid_file).write_text(str(os.getpid()))
steps = 0
while not os.path.exists(gate):
    x[:4096].mul_(1.0)
    torch.cuda.synchronize()
    steps += 1
    if steps % 50 == 0:
        pathlib.Path(beat).write_text(f"{steps} {time.time()}")
    time.sleep(0.01)
ok = bool(torch.all(x == 7.0).item())
print("pattern intact" if ok else "PATTERN CHANGED", steps, flush=True)
sys.exit(0 if ok else 3)
"""

#: Pressure from outside the agent: take GIB of GPU memory, hold it until the stop file.
PRESSURE = """
import os, sys, time, pathlib
import torch
gib, ready, stop = float(sys.argv[1]), sys.argv[2], sys.argv[3]
x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
pathlib.Path(ready).write_text(str(os.getpid()))
while not os.path.exists(stop):
    time.sleep(0.02)
"""


def wait_until(what: str, predicate: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``predicate()`` held; raises TimeoutError naming ``what``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.02)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def check_nvml(report: dict[str, Any]) -> None:
    from laminar_agent.inventory.cuda_checkpoint import detect_cuda_checkpoint
    from laminar_agent.inventory.nvml import NvmlBackend

    backend = NvmlBackend()
    try:
        gpus = backend.gpus()
        report["driver"] = backend.driver_version()
        report["gpus"] = [
            {
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "memory_total_gib": round(g.memory_total_bytes / GIB, 2),
                "mig_instances": len(g.mig_instances),
            }
            for g in gpus
        ]
        timings = []
        for _ in range(200):
            start = time.perf_counter()
            backend.memory_used()
            timings.append(time.perf_counter() - start)
        timings.sort()
        report["memory_used_call_us"] = {
            "p50": round(statistics.median(timings) * 1e6, 1),
            "p99": round(timings[int(0.99 * len(timings))] * 1e6, 1),
        }
        support = detect_cuda_checkpoint("", backend.driver_version())
        report["cuda_checkpoint"] = {
            "available": support.is_available,
            "detail": support.detail,
        }
    finally:
        backend.close()


def metric_sum(metrics_address: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus metric's samples named ``name`` whose labels include ``labels``."""
    body = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read()
    return sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def restores(metrics_address: str) -> float:
    """cuda-checkpoint restores that succeeded, as the agent counts them."""
    return metric_sum(
        metrics_address,
        "laminar_airlock_cuda_checkpoint_toggles_total",
        direction="restore",
        outcome="ok",
    )


def check_airlock(report: dict[str, Any], job_gib: float, root: Path, restart: bool) -> None:
    total = report["gpus"][0]["memory_total_gib"]
    gate, stop = root / "gate", root / "stop"
    env = {
        "LAMINAR_INVENTORY_SHARED_GPUS": "all",
        "LAMINAR_AIRLOCK_POLL_SECONDS": "0.1",
        "PYTHONUNBUFFERED": "1",
    }
    result: dict[str, Any] = {"job_gib": job_gib, "gpu_total_gib": total}
    at_unix = 0.0
    report["airlock"] = result
    with LocalCluster(root / "cluster") as cluster:
        agent = cluster.start_agent(
            "gpuhost", "", extra_args=["--gpu-backend", "nvml"], env=env, timeout_seconds=60
        )
        channel = grpc.insecure_channel(agent.address)
        stub = agent_pb2_grpc.AgentStub(channel)

        def subjob(name: str) -> common_pb2.Subjob:
            return stub.GetSubjob(agent_pb2.GetSubjobRequest(subjob_id=name), timeout=10)

        def used_gib() -> float:
            inv = stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10)
            return inv.gpus[0].memory_used_bytes / GIB

        def restart_agent() -> dict[str, Any]:
            nonlocal agent, channel, stub
            agent.process.send_signal(signal.SIGTERM)
            out: dict[str, Any] = {"agent_exit": agent.process.wait(60)}
            channel.close()
            began = time.monotonic()
            agent = cluster.start_agent(
                "gpuhost", "", extra_args=["--gpu-backend", "nvml"], env=env, timeout_seconds=60
            )
            channel = grpc.insecure_channel(agent.address)
            stub = agent_pb2_grpc.AgentStub(channel)
            out["up_s"] = round(time.monotonic() - began, 3)
            # Two seconds of the new agent's Airlock polls, still under the pressure.
            wait_until(
                "the restarted agent polled for 2 s",
                lambda: (
                    metric_sum(
                        agent.metrics_address, "laminar_airlock_level_seconds_total", kind="host"
                    )
                    >= 2.0
                ),
                60,
            )
            opp = subjob("opp")
            out["opp_after_restart"] = {
                "state": common_pb2.SubjobState.Name(opp.state),
                "reason": opp.reason,
            }
            out["used_after_restart_gib"] = round(used_gib(), 2)
            return out

        inv = stub.GetInventory(agent_pb2.GetInventoryRequest(), timeout=10)
        result["agent_sees_cuda_checkpoint"] = inv.cuda_checkpoint_available
        result["agent_cuda_checkpoint_detail"] = inv.cuda_checkpoint_detail
        result["idle_used_gib"] = round(used_gib(), 2)
        for name, priority in (("prod", common_pb2.PRODUCTION), ("opp", common_pb2.OPPORTUNISTIC)):
            resources = common_pb2.Resources(
                gpu_milli=400, gpu_memory_bytes=int((job_gib + 2) * GIB)
            )
            spec = common_pb2.SubjobSpec(
                subjob_id=name,
                job_id=f"job-{name}",
                command=[
                    sys.executable,
                    "-c",
                    JOB,
                    str(job_gib),
                    str(root / f"{name}.pid"),
                    str(gate),
                    str(root / f"{name}.beat"),
                ],
                priority=priority,
                resources=resources,
            )
            reply = stub.Probe(
                agent_pb2.ProbeRequest(
                    job_id=spec.job_id,
                    resources=resources,
                    priority=priority,
                    commit_if_fits=True,
                    spec=spec,
                ),
                timeout=30,
            )
            if reply.subjob.state != common_pb2.RUNNING:
                raise RuntimeError(f"{name} did not start: {reply}")
        result["jobs_filled_s"] = round(
            wait_until(
                "both subjobs filled their memory",
                lambda: (root / "prod.pid").exists() and (root / "opp.pid").exists(),
                120,
            ),
            2,
        )
        result["used_with_jobs_gib"] = round(used_gib(), 2)
        # Take the GPU past the critical mark (95 % by default) from outside the agent.
        pressure_gib = max(1.0, 0.975 * total - used_gib())
        result["pressure_gib"] = round(pressure_gib, 2)
        pressure = subprocess.Popen(
            [sys.executable, "-c", PRESSURE, str(pressure_gib), str(root / "ready"), str(stop)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until("pressure allocated", lambda: (root / "ready").exists(), 120)
            at, at_unix = time.monotonic(), time.time()
            result["used_under_pressure_gib"] = round(used_gib(), 2)
            wait_until(
                "the opportunistic subjob stopped",
                lambda: subjob("opp").state != common_pb2.RUNNING,
                60,
            )
            result["reaction_s"] = round(time.monotonic() - at, 3)
            opp = subjob("opp")
            result["opp_after_pressure"] = {
                "state": common_pb2.SubjobState.Name(opp.state),
                "reason": opp.reason,
            }
            result["prod_after_pressure"] = common_pb2.SubjobState.Name(subjob("prod").state)
            try:
                result["freed_s"] = round(
                    wait_until("memory freed", lambda: used_gib() < 0.95 * total, 60), 3
                )
            except TimeoutError as exc:
                result["freed_s"] = str(exc)
            result["used_after_stop_gib"] = round(used_gib(), 2)
            if restart and subjob("opp").state == common_pb2.SUSPENDED:
                result["restart"] = restart_agent()
        finally:
            stop.touch()
            output, _ = pressure.communicate(timeout=60)
            result["pressure_exit"] = pressure.returncode
            result["pressure_output"] = output.decode(errors="replace")[-300:]
        released = time.monotonic()
        # (It may have been resumed already, while the pressure process was exiting.)
        if result["opp_after_pressure"]["state"] == "SUSPENDED":
            result["resume_s"] = round(
                wait_until(
                    "the suspended subjob resumed",
                    lambda: subjob("opp").state == common_pb2.RUNNING,
                    120,
                ),
                3,
            )
            result["memory_back_s"] = round(
                wait_until(
                    "its memory back on the GPU", lambda: used_gib() > 30 + job_gib * 0.9, 60
                ),
                3,
            )
            beat = root / "opp.beat"
            before = beat.read_text() if beat.exists() else ""
            result["opp_computes_after_resume_s"] = round(
                wait_until(
                    "the resumed subjob computes",
                    lambda: beat.exists() and beat.read_text() != before,
                    60,
                ),
                3,
            )
        result["since_pressure_released_s"] = round(time.monotonic() - released, 3)
        if "restart" in result:
            try:
                result["restart"]["restored_s"] = round(
                    wait_until(
                        "the restarted agent restored the subjob's CUDA state",
                        lambda: restores(agent.metrics_address) >= 1,
                        60,
                    ),
                    3,
                )
            except TimeoutError as exc:
                result["restart"]["restored_s"] = str(exc)
            result["restart"]["restores_by_restarted_agent"] = restores(agent.metrics_address)
            airlock = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=20), timeout=10)
            result["restart"]["resume_reasons"] = [
                a.reason[:240] for a in airlock.recent_actions if a.step == "resume"
            ]
        gate.touch()
        ended = {common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.KILLED, common_pb2.LOST}
        wait_until(
            "both subjobs ended",
            lambda: subjob("prod").state in ended and subjob("opp").state in ended,
            120,
        )
        for name in ("prod", "opp"):
            s = subjob(name)
            result[f"{name}_final"] = {
                "state": common_pb2.SubjobState.Name(s.state),
                "exit_code": s.exit_code,
                "reason": s.reason,
                "output": stub.ReadLogs(
                    agent_pb2.ReadLogsRequest(subjob_id=name), timeout=10
                ).data.decode(errors="replace")[-300:],
            }
        state = stub.GetAirlock(agent_pb2.GetAirlockRequest(max_actions=50), timeout=10)
        suspends = [a for a in state.recent_actions if a.step == "suspend"]
        if suspends:
            result["decided_after_pressure_s"] = round(suspends[0].at_unix - at_unix, 3)
        result["actions"] = [
            f"{a.step} {a.subjob_id} freed={a.bytes_freed / GIB:.1f}GiB {a.reason}"[:240]
            for a in state.recent_actions
        ]
        channel.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--job-gib", type=float, default=30.0, help="GPU memory per subjob")
    parser.add_argument(
        "--restart",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="restart the agent while a subjob is checkpointed (step 4)",
    )
    args = parser.parse_args()
    report: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        import torch

        report["torch"] = torch.__version__
    except ImportError as exc:
        report["torch"] = f"missing: {exc}"
    for name, step in (("nvml", lambda: check_nvml(report)),):
        try:
            step()
        except Exception as exc:  # report and stop: nothing else can run without NVML
            report[f"{name}_error"] = "".join(traceback.format_exception_only(exc)).strip()
            print(json.dumps(report, indent=2))
            Path(args.out).write_text(json.dumps(report, indent=2))
            return 1
    with tempfile.TemporaryDirectory(prefix="laminar-gpu-check-") as tmp:
        try:
            check_airlock(report, args.job_gib, Path(tmp), args.restart)
        except Exception:
            report["airlock_error"] = traceback.format_exc()[-2000:]
            logs = sorted(Path(tmp).rglob("*.log"))
            report["agent_log_tail"] = logs[0].read_text()[-3000:] if logs else ""
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
