"""Infrastructure every Laminar package shares: errors, units, config loading, gRPC limits,
transport security, systemd notification and the daemon's start-up helpers. The bottom layer:
it imports no other Laminar package."""
