"""Infrastructure every Laminar package shares: errors, units, config loading, gRPC limits,
transport security, systemd notification and the daemon's start-up helpers. The bottom layer:
it imports no other Laminar package."""

import os as _os

# gRPC's fork support (pthread_atfork handlers that stop and restart its threads around a
# fork) is for children that go on using gRPC without exec. Laminar's processes fork only
# to exec (cuda-checkpoint, the launcher, daemons started by the CLI), and with the
# handlers on (grpcio's core default) a child forked while gRPC threads are busy can crash
# before its exec: an agent's cuda-checkpoint restore died of SIGSEGV in gRPC's
# event-engine thread (2 of 30 runs of a test under load), leaving a resumed subjob's CUDA
# state on the host. Read when grpc is first imported, which comes after this package.
_os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"
