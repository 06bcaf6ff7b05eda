"""Airlock: runtime survival under memory pressure. Pure policy plus an I/O-free controller."""
