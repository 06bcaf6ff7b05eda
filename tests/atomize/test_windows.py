"""Agents' window advertisement (ledger, pure) and reading an atomized subjob's checkpoint."""

from __future__ import annotations

from pathlib import Path

from laminar_agent.executor import units_from_checkpoint
from laminar_agent.ledger import Granted, Ledger, ProbeOrder, Slice, SliceKind
from laminar_base.demand import Demand

GIB = 1 << 30
NOW = 1000.0


def _slices() -> list[Slice]:
    return [
        Slice("gpu0", SliceKind.WHOLE_GPU, 0, "GPU-0", "H100", 80 * GIB),
        Slice("gpu1/3g.40gb@0", SliceKind.MIG, 1, "MIG-1-0", "H100", 40 * GIB, "3g.40gb"),
        Slice("gpu1/1g.10gb@6", SliceKind.MIG, 1, "MIG-1-6", "H100", 10 * GIB, "1g.10gb"),
        Slice("gpu2", SliceKind.SHARED_GPU, 2, "GPU-2", "A100", 40 * GIB),
    ]


def _take(ledger: Ledger, demand: Demand, slice_id: str = "") -> str:
    (granted,) = ledger.arbitrate(
        [ProbeOrder("p", "j", 0, demand, 3, 0.0, 0, 10.0, slice_id=slice_id)], NOW
    )
    assert isinstance(granted, Granted)
    ledger.commit(granted.lease.lease_id, "s", NOW)
    return granted.lease.lease_id


def test_free_slices_are_open_windows_from_now_larger_memory_first() -> None:
    windows = Ledger(_slices()).windows(NOW, {}, 16)
    assert [w.slice.slice_id for w in windows] == [
        "gpu0",
        "gpu1/3g.40gb@0",
        "gpu2",
        "gpu1/1g.10gb@6",
    ]
    assert all(w.start_unix == NOW and w.end_unix == 0.0 for w in windows)
    assert windows[0].memory_bytes == 80 * GIB and windows[0].milli == 1000


def test_busy_slices_open_when_their_holders_are_expected_to_end() -> None:
    ledger = Ledger(_slices())
    _take(ledger, Demand(gpus=1), "gpu0")
    _take(ledger, Demand(gpu_milli=300, gpu_memory_bytes=10 * GIB), "gpu2")
    windows = {w.slice.slice_id: w for w in ledger.windows(NOW, {"gpu0": NOW + 60}, 16)}
    assert windows["gpu0"].start_unix == NOW + 60 and windows["gpu0"].memory_bytes == 80 * GIB
    # The shared GPU still has room now: the free share and memory.
    assert windows["gpu2"].start_unix == NOW
    assert (windows["gpu2"].milli, windows["gpu2"].memory_bytes) == (700, 30 * GIB)
    # A busy slice with no declared end advertises nothing; windows that start now come first.
    without_end = ledger.windows(NOW, {}, 16)
    assert "gpu0" not in {w.slice.slice_id for w in without_end}
    ordered = ledger.windows(NOW, {"gpu0": NOW + 60}, 16)
    assert ordered[-1].slice.slice_id == "gpu0"


def test_windows_are_bounded_reserved_slices_hidden_and_commitments_end_windows() -> None:
    ledger = Ledger(_slices())
    assert len(ledger.windows(NOW, {}, 2)) == 2
    ledger.reserve("preemptor", ["gpu0"], NOW + 30)
    assert "gpu0" not in {w.slice.slice_id for w in ledger.windows(NOW, {}, 16)}
    bounded = ledger.windows(NOW, {}, 16, reserved_until={"gpu2": NOW + 90})
    assert next(w for w in bounded if w.slice.slice_id == "gpu2").end_unix == NOW + 90


def test_checkpoint_progress_decides_the_units_done(tmp_path: Path) -> None:
    # Exited 0 without a progress file: the contract says it did all its units.
    assert units_from_checkpoint(str(tmp_path), 10, 5, True)[0] == 5
    # Stopped without a checkpoint: none count.
    assert units_from_checkpoint(str(tmp_path), 10, 5, False)[0] == 0
    (tmp_path / "progress").write_text("13\n")
    assert units_from_checkpoint(str(tmp_path), 10, 5, False) == (
        3,
        "checkpoint covers 3 of 5 unit(s)",
    )
    # A file left by an earlier subjob (its end is this one's start) or garbage: none.
    (tmp_path / "progress").write_text("7")
    assert units_from_checkpoint(str(tmp_path), 10, 5, False)[0] == 0
    (tmp_path / "progress").write_text("lots")
    assert units_from_checkpoint(str(tmp_path), 10, 5, True)[0] == 0
