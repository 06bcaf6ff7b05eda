"""The GPU backends an agent test runs on, behind one small interface, so an Airlock
scenario is written once and parametrized over both (issue 18):

* ``fake``: the fake backend; pressure is injected with InjectLoad, a subjob's memory is
  what it declares, a suspend detaches it.
* ``nvml``: the production NvmlBackend over the mocked NVML of a scenario file. Pressure is
  the GPU's non-process memory in that file; each subjob lists its own process in the
  mock's ``pid_dir`` with what it declares (as NVML lists a CUDA process); a stand-in
  ``cuda-checkpoint`` on the agent's PATH moves that entry out of the GPU and back, as the
  real one moves CUDA state to host memory. The mock lists live processes only, so a
  reclaimed subjob's memory leaves with it, as on a real driver.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import cast

import grpc

from laminar_api.v1 import agent_pb2, agent_pb2_grpc
from laminar_cli.cluster import AgentProcess, LocalCluster

BACKENDS = ("fake", "nvml")
GIB = 1 << 30


class GpuHost:
    """One shared 80 GB A100 for an agent, on backend ``kind``; ``folder`` holds the
    mock's files (nvml)."""

    def __init__(self, kind: str, folder: Path) -> None:
        if kind not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {kind!r}")
        self.kind = kind
        self.folder = folder
        self.scenario = folder / "nvml.json"
        self.pid_dir = folder / "pids"
        self.tools = folder / "bin"
        #: While this file exists, the stand-in's checkpoint of a process does not end (a
        #: long copy); it writes :attr:`checkpointing` (the pid) once it has begun.
        self.hold_checkpoint = folder / "hold-checkpoint"
        self.checkpointing = folder / "checkpointing"
        #: While this file exists, the stand-in's restores fail.
        self.fail_restore = folder / "fail-restore"

    def start(
        self, cluster: LocalCluster, agent_id: str, *, injected: int = 0, **options: object
    ) -> AgentProcess:
        """Start the agent (``options`` go to ``LocalCluster.start_agent``; nvml: with
        ``injected`` bytes on GPU 0 that belong to no subjob from its first reading)."""
        if self.kind == "fake":
            assert not injected, "the fake backend is injected through the running agent"
            return cluster.start_agent(agent_id, "1xA100-80GB:shared", **options)  # type: ignore[arg-type]
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pid_dir.mkdir(exist_ok=True)
        self._write(injected)
        self._install_cuda_checkpoint()
        env = {
            "LAMINAR_INVENTORY_NVML_MOCK": str(self.scenario),
            "LAMINAR_INVENTORY_SHARED_GPUS": "all",
            "PATH": f"{self.tools}{os.pathsep}{os.environ.get('PATH', '')}",
            **cast(dict[str, str], options.pop("env", {})),
        }
        return cluster.start_agent(
            agent_id,
            "",
            extra_args=["--gpu-backend", "nvml"],
            env=env,
            **options,  # type: ignore[arg-type]
        )

    def inject(self, agent: AgentProcess, used_bytes: int) -> None:
        """Memory on GPU 0 that belongs to no subjob."""
        if self.kind == "fake":
            with grpc.insecure_channel(agent.address) as channel:
                agent_pb2_grpc.AgentStub(channel).InjectLoad(
                    agent_pb2.InjectLoadRequest(gpu_index=0, used_bytes=used_bytes), timeout=10
                )
            return
        self._write(used_bytes)

    def command(self, code: str, gpu_memory_bytes: int) -> list[str]:
        """A subjob command running ``code`` whose process uses ``gpu_memory_bytes``."""
        if self.kind == "fake":
            return [sys.executable, "-c", code]
        listing = (
            "import os, pathlib\n"
            f"_d = pathlib.Path({str(self.pid_dir)!r}) / os.environ['CUDA_VISIBLE_DEVICES']\n"
            "_d.mkdir(parents=True, exist_ok=True)\n"
            f"(_d / 'tmp-{{}}'.format(os.getpid())).write_text('{gpu_memory_bytes}')\n"
            "os.replace(_d / 'tmp-{}'.format(os.getpid()), _d / str(os.getpid()))\n"
        )
        return [sys.executable, "-c", listing + code]

    def _write(self, used_bytes: int) -> None:
        scenario = {
            "live_pids_only": True,
            "pid_dir": str(self.pid_dir),
            "gpus": [
                {
                    "name": "NVIDIA A100-SXM4-80GB",
                    "memory_total_bytes": 80 * GIB,
                    "used_bytes": used_bytes,
                }
            ],
        }
        tmp = self.scenario.with_suffix(".tmp")
        tmp.write_text(json.dumps(scenario))
        os.replace(tmp, self.scenario)

    def _install_cuda_checkpoint(self) -> None:
        self.tools.mkdir(exist_ok=True)
        path = self.tools / "cuda-checkpoint"
        path.write_text(
            f"#!{sys.executable}\n"
            "import os, pathlib, sys\n"
            "if sys.argv[1:] == ['--help']:\n"
            "    print('--get-state --pid PID\\n--toggle --pid PID')\n    sys.exit(0)\n"
            "pid = sys.argv[-1]\n"
            # As the real one: a stopped process never answers it (seen on an H200).
            "if open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] in 'Tt':\n"
            "    print('process', pid, 'is stopped')\n    sys.exit(1)\n"
            f"root = pathlib.Path({str(self.pid_dir)!r})\n"
            # The process's state: its listing's name (pid, pid.checkpointed, pid.locked).
            "if sys.argv[1] == '--get-state':\n"
            "    for name, state in ((pid, 'running'), (f'{pid}.checkpointed', 'checkpointed'),"
            " (f'{pid}.locked', 'locked')):\n"
            "        if list(root.glob(f'*/{name}')):\n            print(state)\n"
            "            sys.exit(0)\n"
            "    print('initialization error')\n    sys.exit(1)\n"
            f"hold = pathlib.Path({str(self.hold_checkpoint)!r})\n"
            "if sys.argv[1] == '--toggle' and list(root.glob(f'*/{pid}')) and hold.exists():\n"
            f"    pathlib.Path({str(self.checkpointing)!r}).write_text(pid)\n"
            "    import time\n    end = time.monotonic() + 60\n"
            "    while hold.exists() and time.monotonic() < end:\n        time.sleep(0.05)\n"
            f"if pathlib.Path({str(self.fail_restore)!r}).exists() and sys.argv[1] == '--toggle'"
            " and list(root.glob(f'*/{pid}.checkpointed')):\n"
            "    print('restore failed (fail-restore)')\n    sys.exit(1)\n"
            "if sys.argv[1:3] == ['--action', 'unlock']:\n"
            "    for held in root.glob(f'*/{pid}.locked'):\n"
            "        os.replace(held, held.with_name(pid))\n        sys.exit(0)\n"
            "    print('the operation cannot be performed in the present state')\n"
            "    sys.exit(1)\n"
            "for held in root.glob(f'*/{pid}'):\n"
            "    os.replace(held, held.with_name(f'{pid}.checkpointed'))\n    sys.exit(0)\n"
            "for held in root.glob(f'*/{pid}.checkpointed'):\n"
            "    os.replace(held, held.with_name(pid))\n    sys.exit(0)\n"
            "print('no CUDA state in process', pid)\nsys.exit(1)\n"
        )
        path.chmod(0o755)
