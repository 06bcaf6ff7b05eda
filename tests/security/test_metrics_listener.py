"""The metrics listener follows the gRPC listener's rule: beyond loopback, nothing is
served unauthenticated unless the operator says so. A non-loopback ``server.metrics_listen``
is refused at start (exit 2, one line naming the keys) without ``metrics.tls`` (HTTPS
that requires a client certificate) or ``metrics.insecure_allow_remote``. The refusals
run the daemons' real ``main``; the opt-in is checked on the decision itself, so that no
test serves a public address; HTTPS is scraped from real daemons on loopback."""

from __future__ import annotations

import http.client
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from laminar_agent import __main__ as agent_main
from laminar_agent.config import AgentConfig
from laminar_base.configlib import load_config
from laminar_base.errors import ConfigError
from laminar_base.metrics_http import check_metrics_exposure
from laminar_cli.certs import init_certs
from laminar_cli.cluster import DaemonProcess, LocalCluster
from laminar_zone import __main__ as zone_main
from laminar_zone.config import ZoneConfig

PUBLIC = "0.0.0.0:0"
DAEMONS = {"agent": (agent_main, AgentConfig), "zone": (zone_main, ZoneConfig)}


@pytest.mark.parametrize("daemon", ["agent", "zone"])
def test_a_public_metrics_address_is_refused_without_tls_or_the_opt_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], daemon: str
) -> None:
    module, _ = DAEMONS[daemon]
    state = tmp_path / daemon
    argv = ["--listen", "127.0.0.1:0", "--metrics-listen", PUBLIC, "--state-dir", str(state)]
    if daemon == "agent":
        argv += ["--gpu-backend", "fake", "--fake-gpus", "1xA100-40GB"]
    assert module.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "server.metrics_listen" in err and "metrics.insecure_allow_remote" in err, err
    assert "metrics.tls" in err, err
    assert not (state / f"{daemon}.json").exists()  # it never served


@pytest.mark.parametrize("how", ["toml", "env"])
@pytest.mark.parametrize("daemon", ["agent", "zone"])
def test_the_opt_in_or_tls_allows_a_public_metrics_address(
    tmp_path: Path, daemon: str, how: str
) -> None:
    _, root = DAEMONS[daemon]
    certs = tmp_path / "certs"
    init_certs(certs, ["daemon"])
    toml = tmp_path / "daemon.toml"

    def decide(section: dict[str, str]) -> None:
        lines = "".join(f"{k} = {v}\n" for k, v in section.items())
        toml.write_text(f"[metrics]\n{lines}" if how == "toml" else "")
        env = {f"LAMINAR_METRICS_{k.upper()}": v.strip('"') for k, v in section.items()}
        config: Any = load_config(
            root,
            toml_path=str(toml),
            env=env if how == "env" else {},
            overrides={"server.metrics_listen": PUBLIC},
        )
        check_metrics_exposure(config.server.metrics_listen, config.metrics)

    decide({"insecure_allow_remote": "true"})
    decide(
        {
            "tls": "true",
            "cert_file": f'"{certs / "daemon.pem"}"',
            "key_file": f'"{certs / "daemon-key.pem"}"',
            "client_ca_file": f'"{certs / "ca.pem"}"',
        }
    )
    with pytest.raises(ConfigError) as refused:
        decide({})
    assert refused.value.field == "server.metrics_listen"


def test_loopback_metrics_need_no_set_up() -> None:
    for listen in ("127.0.0.1:0", "localhost:9400", "[::1]:9401", ""):
        for root in (AgentConfig, ZoneConfig):
            config: Any = load_config(root, env={}, overrides={"server.metrics_listen": listen})
            check_metrics_exposure(listen, config.metrics)


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"cert_file": "/x.pem"}, "metrics.cert_file"),  # ignored without tls: refused
        ({"client_ca_file": "/x.pem"}, "metrics.client_ca_file"),
        ({"tls": True}, "metrics.cert_file"),  # no file of its own nor [tls]'s
        (
            {"tls": True, "cert_file": "/nowhere.pem", "key_file": "/k", "client_ca_file": "/c"},
            "metrics.cert_file",
        ),
    ],
)
def test_metrics_tls_settings_are_checked_naming_the_key(section: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as bad:
        load_config(AgentConfig, env={}, overrides={f"metrics.{k}": v for k, v in section.items()})
    assert bad.value.field == key


def _scrape(daemon: DaemonProcess, context: ssl.SSLContext | None) -> str:
    scheme = "https" if context is not None else "http"
    url = f"{scheme}://{daemon.metrics_address}/metrics"
    with urllib.request.urlopen(url, timeout=10, context=context) as reply:
        return str(reply.read().decode())


@pytest.mark.parametrize("daemon", ["agent", "zone"])
def test_metrics_over_tls_need_a_client_certificate(tmp_path: Path, daemon: str) -> None:
    """The daemon's [tls] files serve HTTPS; a scraper needs a certificate of the CA (one
    with no Laminar role, as Prometheus gets, is enough); a second CA's metrics.* files
    replace them."""
    certs, scrapers = tmp_path / "certs", tmp_path / "scrapers"
    init_certs(certs, ["router=router+peer", "agent=agent", "prometheus"])
    init_certs(scrapers, ["prometheus"])
    tls = [
        f"--tls-ca-file={certs / 'ca.pem'}",
        f"--tls-cert-file={certs / ('router' if daemon == 'zone' else 'agent')}.pem",
        f"--tls-key-file={certs / ('router' if daemon == 'zone' else 'agent')}-key.pem",
    ]

    def start(cluster: LocalCluster, env: dict[str, str]) -> DaemonProcess:
        env = {"LAMINAR_METRICS_TLS": "true", **env}
        if daemon == "zone":
            return cluster.start_zone("z", extra_args=tls, env=env)
        return cluster.start_agent("h", "1xA100-40GB", extra_args=tls, env=env)

    def client(folder: Path, cert: str | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        if cert is not None:
            context.load_cert_chain(folder / f"{cert}.pem", folder / f"{cert}-key.pem")
        return context

    family = f"laminar_{daemon}_build_info"
    with LocalCluster(tmp_path / "run") as cluster:
        served = start(cluster, {})
        assert family in _scrape(served, client(certs, "prometheus"))
        with pytest.raises(OSError):
            _scrape(served, client(certs, None))  # no client certificate
        with pytest.raises(OSError):
            _scrape(served, client(scrapers, "prometheus"))  # another CA's
        with pytest.raises((OSError, http.client.HTTPException)):
            _scrape(served, None)  # plain HTTP
    with LocalCluster(tmp_path / "run2") as cluster:
        served = start(cluster, {"LAMINAR_METRICS_CLIENT_CA_FILE": str(scrapers / "ca.pem")})
        assert family in _scrape(served, client(scrapers, "prometheus"))
        with pytest.raises(OSError):
            _scrape(served, client(certs, "prometheus"))
