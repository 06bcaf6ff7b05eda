"""How often the router's queue loop runs a pass (laminar_zone.queue_loop.QueueLoop.run):
wakes within ``queue.min_pass_seconds`` share one pass, and a pass over a long queue is
followed by a pause as long as it took, so queue passes never take more than half the
event loop (laminar_zone.core.pass_gap)."""

from __future__ import annotations

from laminar_zone.core import pass_gap


def test_short_passes_are_the_least_interval_apart() -> None:
    assert pass_gap(0.02, 0.001) == 0.02
    assert pass_gap(0.02, 0.0) == 0.02


def test_a_long_pass_leaves_the_loop_as_much_time_again() -> None:
    # 5,000 queued jobs took about 60 ms a pass (bench/queue_pass.py): the next starts
    # 120 ms after this one did, so the loop spends at most half its time in passes.
    assert pass_gap(0.02, 0.06) == 0.12
