"""The `laminar` command."""

# Before anything imports grpc: laminar_base turns gRPC's fork handlers off (see there).
import laminar_base  # noqa: F401
