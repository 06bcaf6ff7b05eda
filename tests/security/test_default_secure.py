"""Issue 13, item 2: the default control plane was open (no TLS, no secret, one warning
line). Now a daemon refuses to start on a non-loopback address without authentication,
and a router there also without submitter tokens, in one line naming the keys, exit 2;
``control.insecure`` is the operator's explicit opt-out whichever way it is given (TOML,
environment, flag). The refusals are checked on the real daemons' ``main``; the opt-out
on the bind decision itself, so that no test ever serves a public address."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from laminar_agent import __main__ as agent_main
from laminar_agent.config import AgentConfig
from laminar_base.configlib import load_config
from laminar_base.errors import ConfigError
from laminar_base.security import check_exposure, load_trust, security_overrides, write_file
from laminar_zone import __main__ as zone_main
from laminar_zone.config import ZoneConfig

PUBLIC = "0.0.0.0:0"


def test_a_router_with_a_secret_but_no_tokens_refuses_a_public_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "secret"
    write_file(secret, b"a-shared-secret-of-enough-length\n", 0o600)
    state = tmp_path / "zone"
    argv = ["--listen", PUBLIC, "--state-dir", str(state), "--shared-secret-file", str(secret)]
    assert zone_main.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "auth.tokens_file" in err and "--insecure" in err, err
    assert not (state / "zone.json").exists()  # it never served


@pytest.mark.parametrize("how", ["toml", "env", "flag"])
@pytest.mark.parametrize("daemon", ["agent", "zone"])
def test_control_insecure_is_the_only_opt_out_and_works_every_way(
    tmp_path: Path, how: str, daemon: str
) -> None:
    module: Any = agent_main if daemon == "agent" else zone_main
    root: Any = AgentConfig if daemon == "agent" else ZoneConfig
    toml = tmp_path / "daemon.toml"
    toml.write_text("[control]\ninsecure = true\n" if how == "toml" else "")
    env = {"LAMINAR_CONTROL_INSECURE": "true"} if how == "env" else {}
    argv = ["--listen", PUBLIC] + (["--insecure"] if how == "flag" else [])
    args = module.build_parser().parse_args(argv)

    def decide(config_env: dict[str, str], overrides: dict[str, Any]) -> None:
        config = load_config(
            root,
            toml_path=str(toml),
            env=config_env,
            overrides={"server.listen": PUBLIC, **overrides},
        )
        trust = load_trust(config.tls, config.control)
        check_exposure(
            trust,
            config.server.listen,
            insecure=config.control.insecure,
            tokens_file=config.auth.tokens_file if daemon == "zone" else None,
        )

    decide(env, security_overrides(args))  # the operator said so: allowed
    # without the opt-out the same start is refused, naming the keys
    toml.write_text("")
    plain = module.build_parser().parse_args(["--listen", PUBLIC])
    with pytest.raises(ConfigError) as refused:
        decide({}, security_overrides(plain))
    assert refused.value.field == "server.listen"
    assert "control.shared_secret_file" in str(refused.value)
    assert "tls.ca_file" in str(refused.value)


def test_loopback_needs_no_set_up() -> None:
    for listen in ("127.0.0.1:0", "localhost:7400", "[::1]:7401"):
        for daemon_root in (AgentConfig, ZoneConfig):
            config: Any = load_config(
                daemon_root, toml_path=None, env={}, overrides={"server.listen": listen}
            )
            trust = load_trust(config.tls, config.control)
            check_exposure(trust, listen, insecure=False, tokens_file="")
