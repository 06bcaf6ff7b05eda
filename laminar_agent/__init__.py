"""laminar-agent: the per-host daemon, the only authority on its host's capacity."""
