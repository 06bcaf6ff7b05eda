"""Calibration pooled per job family: a new job learns from its elders' pieces (issue 17)."""

from __future__ import annotations

from laminar_zone.market import POOL_RATIOS, Calibrator, Profile, RatioPool, quantiles_from

GIB = 1024**3


def declared(scale: float = 1.0) -> Profile:
    return Profile(
        quantiles_from([(0.5, 8.0 * scale), (0.95, 10.0 * scale)], "time"),
        quantiles_from([(0.5, 8.0 * GIB), (0.95, 10.0 * GIB)], "memory"),
    )


def q95(c: Calibrator) -> float:
    return c.profile().seconds_per_unit.value_at(0.95)


def test_a_new_job_of_a_family_starts_from_what_its_elders_ran() -> None:
    pool = RatioPool()
    elder = Calibrator(declared(), 0.05, pool=pool)
    for _ in range(19):  # the family ran 19 pieces at half the declared time
        elder.observe(5.0, 8.0 * GIB)
    newcomer = Calibrator(declared(), 0.05, pool=pool)
    alone = Calibrator(declared(), 0.05)
    assert newcomer.observed == 0
    assert q95(newcomer) == q95(elder) == 5.0
    assert q95(alone) == 10.0  # a job without a family trusts only its declaration
    # Its own declaration is the scale (the prior): a job declaring twice as slow units
    # is predicted twice as slow.
    slower = Calibrator(declared(scale=2.0), 0.05, pool=pool)
    assert q95(slower) == 10.0


def test_below_the_minimum_the_family_never_shrinks_and_the_version_moves() -> None:
    pool = RatioPool()
    a, b = Calibrator(declared(), 0.05, pool=pool), Calibrator(declared(), 0.05, pool=pool)
    before = b.version
    for _ in range(18):
        a.observe(5.0, 8.0 * GIB)
    assert q95(b) == 10.0  # 18 < ceil(1 / 0.05) - 1 samples: not trusted to be faster
    assert b.version != before  # a cached profile of b must be recomputed
    a.overran(time=True, memory=False)
    assert q95(a) == 15.0 and q95(b) == 10.0  # widening stays the job's own


def test_the_pool_keeps_the_most_recent_ratios() -> None:
    pool = RatioPool()
    c = Calibrator(declared(), 0.05, pool=pool)
    for i in range(POOL_RATIOS + 100):
        c.observe(20.0 if i < 100 else 5.0, 8.0 * GIB)
    assert len(pool.time_ratios) == len(pool.memory_ratios) == POOL_RATIOS
    assert q95(c) == 5.0  # the slow early pieces have aged out
