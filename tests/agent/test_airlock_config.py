"""The agent's ``airlock`` config section: defaults, units, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar_agent.__main__ import build_parser
from laminar_agent.config import AgentConfig, AirlockSettings
from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.metrics import AgentMetrics
from laminar_agent.state import AgentState
from laminar_airlock.levels import Level
from laminar_airlock.signals import StaticHostMemory
from laminar_base.configlib import describe_config, load_config
from laminar_base.errors import ConfigError

GIB = 1024**3


def test_defaults_and_what_they_feed() -> None:
    config = load_config(AgentConfig)
    a = config.airlock
    assert a.poll_seconds == 0.1 and a.max_readdress == 2 and not a.dry_run
    policy = a.policy_config()
    assert policy.max_readdress == 2
    assert policy.reclaim_after_seconds == a.readdress_deadline_seconds
    assert a.slice_marks().critical_ratio == a.critical_ratio
    assert a.host_marks().elevated_ratio == a.host_elevated_ratio
    # The ladder's tuning (issue 18) is the agent's to set, and reaches the policy.
    tuned = load_config(
        AgentConfig,
        env={"LAMINAR_AIRLOCK_PREDICT_SECONDS": "500ms", "LAMINAR_AIRLOCK_LOSS_WAIT_RATIO": "3"},
    ).airlock.policy_config()
    assert (tuned.predict_seconds, tuned.loss_wait_ratio) == (0.5, 3.0)
    assert (policy.predict_seconds, policy.loss_wait_ratio) == (2.0, 2.0)


def test_toml_env_and_flags_with_units(tmp_path: Path) -> None:
    toml = tmp_path / "agent.toml"
    toml.write_text(
        "[airlock]\n"
        'poll_seconds = "50ms"\n'
        'elevated_bytes = "70GiB"\n'
        'critical_bytes = "76GiB"\n'
        'readdress_after_seconds = "2m"\n'
    )
    config = load_config(
        AgentConfig,
        toml_path=toml,
        env={"LAMINAR_AIRLOCK_MAX_READDRESS": "3", "LAMINAR_AIRLOCK_HOLD_SECONDS": "250ms"},
        overrides={"airlock.dry_run": True},
    )
    a = config.airlock
    assert a.poll_seconds == pytest.approx(0.05)
    assert (a.elevated_bytes, a.critical_bytes, a.clear_bytes) == (70 * GIB, 76 * GIB, None)
    assert a.readdress_after_seconds == 120.0 and a.max_readdress == 3
    assert a.hold_seconds == pytest.approx(0.25) and a.dry_run
    marks = a.slice_marks()
    assert marks.elevated_bytes == 70 * GIB and marks.hold_seconds == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"LAMINAR_AIRLOCK_POLL_SECONDS": "0"}, "airlock.poll_seconds"),
        ({"LAMINAR_AIRLOCK_CRITICAL_RATIO": "1.5"}, "airlock.critical_ratio"),
        ({"LAMINAR_AIRLOCK_CLEAR_RATIO": "0.9"}, "airlock.clear_ratio"),
        ({"LAMINAR_AIRLOCK_ELEVATED_RATIO": "0.99"}, "airlock.elevated_ratio"),
        ({"LAMINAR_AIRLOCK_HOST_CLEAR_RATIO": "0.95"}, "airlock.host_clear_ratio"),
        ({"LAMINAR_AIRLOCK_TARGET_RATIO": "0"}, "airlock.target_ratio"),
        ({"LAMINAR_AIRLOCK_ELEVATED_BYTES": "lots"}, "airlock.elevated_bytes"),
        ({"LAMINAR_AIRLOCK_CRITICAL_BYTES": "0"}, "airlock.critical_bytes"),
        (
            {"LAMINAR_AIRLOCK_ELEVATED_BYTES": "70GiB", "LAMINAR_AIRLOCK_CRITICAL_BYTES": "60GiB"},
            "airlock.elevated_bytes",
        ),
        ({"LAMINAR_AIRLOCK_HOLD_SECONDS": "-1"}, "airlock.hold_seconds"),
        ({"LAMINAR_AIRLOCK_PREDICT_SECONDS": "-1"}, "airlock.predict_seconds"),
        ({"LAMINAR_AIRLOCK_LOSS_WAIT_RATIO": "-0.5"}, "airlock.loss_wait_ratio"),
        ({"LAMINAR_AIRLOCK_DRY_RUN": "maybe"}, "airlock.dry_run"),
        ({"LAMINAR_AIRLOCK_MAX_READDRESS": "-1"}, "airlock.max_readdress"),
        ({"LAMINAR_AIRLOCK_MAX_READDRESS": "two"}, "airlock.max_readdress"),
        (
            {"LAMINAR_AIRLOCK_READDRESS_DEADLINE_SECONDS": "10s"},
            "airlock.readdress_deadline_seconds",
        ),
        ({"LAMINAR_AIRLOCK_RECLAIM_GRACE_SECONDS": "soon"}, "airlock.reclaim_grace_seconds"),
        ({"LAMINAR_AIRLOCK_HOST_PSI_ELEVATED_PERCENT": "150"}, "airlock.host_psi_elevated_percent"),
    ],
)
def test_invalid_values_name_the_key(env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(AgentConfig, env=env)
    assert key in str(info.value)


def test_every_airlock_key_is_documented_with_its_unit() -> None:
    rows = [row for row in describe_config(AgentConfig) if row[0].startswith("airlock.")]
    assert len(rows) >= 15
    for key, env_name, _, text in rows:
        assert env_name == "LAMINAR_" + key.replace(".", "_").upper()
        assert text, key
        if key.endswith("_seconds"):
            assert "[seconds]" in text, key
        if key.endswith("_bytes"):
            assert "[bytes]" in text, key
        if key.endswith("_ratio"):
            assert "[ratio]" in text, key


def test_dry_run_flag() -> None:
    assert build_parser().parse_args(["--airlock-dry-run"]).airlock_dry_run is True
    assert build_parser().parse_args([]).airlock_dry_run is None  # config decides


def test_host_level_from_memory_marks_and_psi(tmp_path: Path) -> None:
    """The host level rises on its own marks; PSI alone holds it at ELEVATED, never more."""
    source = StaticHostMemory(50 * GIB, 100 * GIB, psi_some_avg10=0.0)
    state = AgentState(
        "h",
        FakeGpuBackend("1xA100-40GB", agent_id="h"),
        AgentMetrics(),
        tmp_path,
        airlock=AirlockSettings(hold_seconds=0.0),
        host_memory=source,
    )
    try:
        state.poll_memory()
        assert state.host_level == Level.NORMAL
        source.set(98 * GIB, 100 * GIB, psi_some_avg10=0.0)
        state.poll_memory()
        assert state.host_level == Level.CRITICAL and state.pressure == Level.CRITICAL
        source.set(50 * GIB, 100 * GIB, psi_some_avg10=95.0)
        state.poll_memory()
        assert state.host_level == Level.ELEVATED
        source.set(50 * GIB, 100 * GIB, psi_some_avg10=1.0)
        state.poll_memory()
        assert state.host_level == Level.NORMAL
        summary = state.summary_message()
        assert summary.pressure == int(Level.NORMAL)
        message = state.airlock_message(10)
        assert message.host_memory_total_bytes == 100 * GIB and not message.dry_run
    finally:
        state.node.journal.close()
