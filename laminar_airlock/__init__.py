"""Airlock: runtime survival under memory pressure. Pure policy plus an I/O-free controller.

Lowest layer: imports neither grpc, laminar_api nor laminar_agent.

* ``laminar_airlock.levels``: ``Level`` (values match proto laminar.v1.PressureLevel), ``Marks`` and
  ``LevelTracker`` (rise at once, fall only after a hold time below a lower mark).
* ``laminar_airlock.policy``: ``decide(snapshot, config) -> list[Action]``, the deterministic ladder
  (suspend / release_memory / resume / readdress / reclaim), and ``plan_room`` for priority
  preemption.
* ``laminar_airlock.signals``: ``HostMemorySource`` with ``PsutilHostMemory`` and ``StaticHostMemory``.
"""
