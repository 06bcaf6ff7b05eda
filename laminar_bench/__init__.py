"""Live benchmarks of the real daemons on loopback (numbers are reported, never asserted)."""
