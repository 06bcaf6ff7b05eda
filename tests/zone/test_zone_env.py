"""A job's environment cannot override what the agent owns, end to end through the router.

The executor drops ``CUDA_VISIBLE_DEVICES`` and every ``LAMINAR_*`` key of the user's
environment (tests/executor covers it in isolation); here a job submitted to a real
router and run by a real agent reads its environment back through ``GetLogs``.
"""

from __future__ import annotations

import json

from zonekit import Zone

from laminar_api.v1 import common_pb2, zone_pb2

DUMP = (
    "import json, os\n"
    "print(json.dumps({k: v for k, v in os.environ.items()"
    " if k.startswith('LAMINAR_') or k in ('CUDA_VISIBLE_DEVICES', 'MINE')}))\n"
)


def test_job_env_cannot_override_gpu_assignment_or_laminar_keys(zone: Zone) -> None:
    evil = {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "LAMINAR_JOB_ID": "j-evil",
        "LAMINAR_SUBJOB_ID": "s-evil",
        "LAMINAR_GPU_MEM_FILE": "/etc/passwd",
        "LAMINAR_ANYTHING": "x",
        "MINE": "kept",
    }
    job = zone.submit(DUMP, resources=common_pb2.Resources(gpus=1), env=evil)
    done = zone.wait_state(job.job_id, zone_pb2.JOB_SUCCEEDED, zone_pb2.JOB_FAILED)
    assert done.state == zone_pb2.JOB_SUCCEEDED, done.reason
    logs = zone.stub.GetLogs(zone_pb2.GetLogsRequest(job_id=job.job_id), timeout=10)
    seen = json.loads(logs.data.decode())
    placement = done.placements[-1]
    assert seen["MINE"] == "kept"
    assert seen["LAMINAR_JOB_ID"] == job.job_id
    assert seen["LAMINAR_SUBJOB_ID"] == placement.subjob_id
    assert seen["CUDA_VISIBLE_DEVICES"] not in ("0,1,2,3", "")
    assert seen["CUDA_VISIBLE_DEVICES"].startswith(("GPU-", "MIG-"))
    assert seen["LAMINAR_GPU_MEM_FILE"] != "/etc/passwd"
    assert "LAMINAR_ANYTHING" not in seen
