"""MIG placement legality per model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_agent.inventory.mig import (
    COMPUTE_SLICES,
    MEMORY_SLICES,
    MIG_PROFILES,
    lookup_profile,
    place_profiles,
)
from laminar_base.errors import InvalidArgument


def assert_legal(model: str, layout: tuple[tuple[str, int, int], ...]) -> None:
    used = 0
    compute = 0
    for profile, start, size in layout:
        entry = lookup_profile(model, profile)
        assert start in entry.starts
        assert size == entry.size
        assert start + size <= MEMORY_SLICES
        mask = ((1 << size) - 1) << start
        assert not used & mask, f"overlap in {layout}"
        used |= mask
        compute += entry.compute_slices
    assert compute <= COMPUTE_SLICES


@pytest.mark.parametrize(
    ("model", "profiles", "expected"),
    [
        ("H100-80GB", ["7g.80gb"], (("7g.80gb", 0, 8),)),
        ("H100-80GB", ["3g.40gb", "3g.40gb"], (("3g.40gb", 0, 4), ("3g.40gb", 4, 4))),
        (
            "H100-80GB",
            ["3g.40gb", "2g.20gb", "1g.10gb"],
            (("3g.40gb", 0, 4), ("2g.20gb", 4, 2), ("1g.10gb", 6, 1)),
        ),
        # First-fit would put the 1g at 0 and block the 4g; the search moves it.
        ("A100-80GB", ["1g.10gb", "4g.40gb"], (("1g.10gb", 4, 1), ("4g.40gb", 0, 4))),
        ("A100-40GB", ["1g.10gb"] * 4, tuple(("1g.10gb", s, 2) for s in (0, 2, 4, 6))),
        ("A100-40GB", ["1g.5gb"] * 7, tuple(("1g.5gb", s, 1) for s in range(7))),
        ("A100-40GB", ["4g.20gb", "3g.20gb"], (("4g.20gb", 0, 4), ("3g.20gb", 4, 4))),
    ],
)
def test_place_profiles_known_layouts(
    model: str, profiles: list[str], expected: tuple[tuple[str, int, int], ...]
) -> None:
    layout = place_profiles(model, profiles)
    assert layout == expected
    assert_legal(model, layout)


@pytest.mark.parametrize(
    ("model", "profiles", "reason"),
    [
        ("L4-24GB", ["1g.10gb"], "does not support MIG"),
        ("H100-80GB", ["1g.5gb"], "unknown MIG profile"),
        ("A100-40GB", ["3g.40gb"], "unknown MIG profile"),
        ("H100-80GB", ["7g.80gb", "1g.10gb"], "does not fit"),
        ("H100-80GB", ["4g.40gb", "4g.40gb"], "does not fit"),
        ("A100-40GB", ["1g.5gb"] * 8, "does not fit"),
        ("A100-80GB", ["2g.20gb"] * 4, "does not fit"),  # 2g starts only at 0,2,4
        ("A100-40GB", ["1g.10gb"] * 5, "does not fit"),
    ],
)
def test_place_profiles_rejects(model: str, profiles: list[str], reason: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        place_profiles(model, profiles)
    assert info.value.field == "fake_gpus"
    assert reason in str(info.value)
    assert str(info.value).startswith("fake_gpus: ")


@settings(max_examples=150, deadline=None)
@given(
    model=st.sampled_from(sorted(MIG_PROFILES)),
    picks=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=8),
)
def test_place_profiles_result_is_always_legal(model: str, picks: list[int]) -> None:
    names = list(MIG_PROFILES[model])
    profiles = [names[i] for i in picks]
    try:
        layout = place_profiles(model, profiles)
    except InvalidArgument as exc:
        assert exc.field == "fake_gpus"
        assert "does not fit" in str(exc)
        return
    assert [p for p, _, _ in layout] == profiles
    assert_legal(model, layout)


def test_tables_match_nvidia_geometry() -> None:
    h100 = MIG_PROFILES["H100-80GB"]
    assert h100["1g.10gb"].starts == (0, 1, 2, 3, 4, 5, 6)
    assert h100["2g.20gb"].starts == (0, 2, 4)
    assert h100["3g.40gb"].starts == (0, 4)
    assert h100["4g.40gb"].starts == (0,)
    assert h100["7g.80gb"].size == 8
    assert h100["3g.40gb"].memory_bytes == 40 * 1024**3
    a40 = MIG_PROFILES["A100-40GB"]
    assert a40["1g.10gb"].size == 2
    assert a40["1g.10gb"].compute_slices == 1
    assert a40["1g.10gb"].starts == (0, 2, 4, 6)
