"""A router's target workload outside the simulator: a prior from
``placement.workload_prior_file`` (what ``sim fgd --workload-prior`` gives the simulator's
routers) and what it observed, kept in its journal across a restart."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_membership import open_state

from laminar_base.configlib import load_config
from laminar_base.demand import Demand, HostCap
from laminar_base.errors import ConfigError
from laminar_base.fragmentation import (
    MILLI_SLICING,
    MIN_OBSERVED,
    ObservedWorkload,
    PodShape,
    demand_pod,
    workload_from_rows,
    workload_rows,
)
from laminar_sim import traces
from laminar_sim.fgd import laminar_workload_prior
from laminar_zone.config import ZoneConfig
from laminar_zone.persistence import WORKLOAD_META
from laminar_zone.view import learned_ranking

shape_st = st.builds(
    PodShape,
    st.integers(0, 96_000),
    st.just(0),
    st.integers(1, 8),
    st.sampled_from([250, 500, 1000]),
    st.sampled_from([(), ("A100",), ("T4", "V100M16")]),
) | st.builds(PodShape, st.integers(0, 96_000), st.just(0), st.just(0), st.just(0))


@settings(max_examples=200, deadline=None)
@given(counts=st.dictionaries(shape_st, st.integers(1, 10_000), max_size=20))
def test_rows_round_trip_through_json(counts: dict[PodShape, int]) -> None:
    rows = json.loads(json.dumps(workload_rows(counts)))
    assert workload_from_rows(rows, "f") == Counter(counts)


@pytest.mark.parametrize(
    ("rows", "names"),
    [
        ({"cpu_milli": 1}, "f: must be a list"),
        ([{"cpu_milli": -1, "count": 1}], "f[0].cpu_milli"),
        ([{"num_gpu": 1, "gpu_milli": 1500, "count": 1}], "f[0].gpu_milli"),
        ([{"num_gpu": 2, "count": 1}], "f[0].gpu_milli"),
        ([{"count": "3"}], "f[0].count"),
        ([{"gpu_models": "A100", "count": 1}], "f[0].gpu_models"),
        ([1], "f[0]: must be an object"),
    ],
)
def test_a_malformed_workload_names_the_row_and_field(rows: object, names: str) -> None:
    with pytest.raises(ValueError, match=names.replace("[", r"\[").replace("]", r"\]")):
        workload_from_rows(rows, "f")


def test_the_prior_file_is_what_the_simulator_gives_its_routers(tmp_path: Path) -> None:
    """The pod list's mix written as a prior file and loaded by the router's config is the
    prior ``sim fgd --workload-prior`` starts its routers from, shape for shape."""
    pods = [
        traces.PodShape(4000, 8192, 1, 500),
        traces.PodShape(4000, 8192, 1, 500),
        traces.PodShape(32000, 65536, 8, 1000),
        traces.PodShape(2000, 4096, 0, 0),
        traces.PodShape(8000, 16384, 1, 250, ("T4",)),
    ]
    prior = laminar_workload_prior(pods, MILLI_SLICING)
    path = tmp_path / "prior.json"
    path.write_text(json.dumps(workload_rows(prior)))
    simulated = ObservedWorkload(MILLI_SLICING)
    simulated.add_prior(prior)  # as the simulator's routers start (host memory not kept)
    config = load_config(ZoneConfig, overrides={"placement.workload_prior_file": str(path)})
    assert config.workload_prior() == simulated.counts
    state = open_state(tmp_path, **{"placement.workload_prior_file": str(path)})
    try:
        assert state.placer.workload.counts == simulated.counts
        assert state.placer.workload.observed == sum(prior.values())
        assert not state.placer.workload.own  # a prior is not told to peers
    finally:
        state.store.close()


@pytest.mark.parametrize(
    ("text", "says"),
    [('[{"count": -2}]', "count"), ("not json", "Expecting value"), ("{}", "must be a list")],
)
def test_a_bad_prior_file_is_a_config_error_naming_the_key(
    tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "prior.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says) as caught:
        load_config(ZoneConfig, overrides={"placement.workload_prior_file": str(path)})
    assert caught.value.field == "placement.workload_prior_file"
    with pytest.raises(ConfigError) as missing:
        load_config(
            ZoneConfig, overrides={"placement.workload_prior_file": str(tmp_path / "none.json")}
        )
    assert missing.value.field == "placement.workload_prior_file"


async def test_a_restarted_router_ranks_by_what_it_observed_before(tmp_path: Path) -> None:
    """The router journals its observed shapes at the sweep; after a restart they are its
    own observations again (told to peers), not relearned from nothing."""
    state = open_state(tmp_path)
    needs = [Demand(gpu_milli=500), Demand(gpu_milli=500), Demand(gpus=2), Demand(cpu_milli=4000)]
    try:
        for need in needs:
            state.placer.workload.observe(demand_pod(need, HostCap()))
        state.sweep()
        learned = Counter(state.placer.workload.own)
        assert learned and sum(learned.values()) == len(needs)
    finally:
        await state.close()
        state.store.close()
    again = open_state(tmp_path)
    try:
        assert not again.placer.workload.counts
        again.recover()
        assert again.placer.workload.own == learned
        assert again.placer.workload.counts == learned
        assert again.placer.workload.cache() is not None
    finally:
        await again.close()
        again.store.close()


async def test_the_journaled_workload_is_a_prior_file_for_another_router(tmp_path: Path) -> None:
    """docs/zone.md's recipe: the journal's ``workload`` meta row, read from ``zone.db`` as
    it is, is a ``placement.workload_prior_file`` that starts a new router (another zone,
    or one whose journal is gone) from what this one learned."""
    state = open_state(tmp_path)
    needs = [Demand(gpu_milli=500), Demand(gpu_milli=250), Demand(gpus=4), Demand(cpu_milli=1)]
    try:
        for need in needs:
            state.placer.workload.observe(demand_pod(need, HostCap()))
        state.sweep()
        learned = Counter(state.placer.workload.own)
    finally:
        await state.close()
        state.store.close()
    with sqlite3.connect(tmp_path / "zone.db") as db:
        (text,) = db.execute("SELECT value FROM meta WHERE key = 'workload'").fetchone()
    path = tmp_path / "prior.json"
    path.write_text(text)
    fresh = open_state(tmp_path, "other.db", **{"placement.workload_prior_file": str(path)})
    try:
        assert len(learned) == 4 and fresh.placer.workload.counts == learned
        assert not fresh.placer.workload.own
    finally:
        await fresh.close()
        fresh.store.close()


async def test_a_damaged_journaled_workload_is_relearned_not_fatal(tmp_path: Path) -> None:
    state = open_state(tmp_path)
    try:
        state.store.set_meta(WORKLOAD_META, '[{"count": "many"}]')
        assert state.recover() == 0
        assert not state.placer.workload.counts
    finally:
        await state.close()
        state.store.close()


async def test_the_min_observed_setting_reaches_the_router_and_holds_its_ranking(
    tmp_path: Path,
) -> None:
    """``placement.workload_min_observed``: until that many tasks were observed the router
    ranks tasks of one GPU by no target (first fit in its host order); a task of several
    GPUs is ranked from the first, and the agents are handed the target from the first."""
    state = open_state(tmp_path, **{"placement.workload_min_observed": 4})
    try:
        workload = state.placer.workload
        assert workload.min_observed == 4
        ranks = [learned_ranking(workload, Demand(gpu_milli=500)) for _ in range(2)]
        assert ranks == [None, None] and workload.version != 0
        assert learned_ranking(workload, Demand(gpus=2)) is not None
        assert learned_ranking(workload, Demand(gpu_milli=500)) is not None
        assert workload.observed == 4
    finally:
        await state.close()
        state.store.close()


def test_a_negative_min_observed_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="must be >= 0") as caught:
        load_config(ZoneConfig, overrides={"placement.workload_min_observed": -1})
    assert caught.value.field == "placement.workload_min_observed"
    assert load_config(ZoneConfig).placement.workload_min_observed == MIN_OBSERVED
