"""The Prometheus listener of both daemons (``server.metrics_listen``), under the rule the
gRPC listener follows: nothing beyond loopback is served unauthenticated unless asked.

Beyond loopback the metrics are served only over HTTPS that requires a client
certificate signed by the configured CA (``metrics.tls``), or as plain HTTP when
``metrics.insecure_allow_remote`` says so. Not covered: which certificate may scrape
(any the CA signed may; give Prometheus one with no Laminar role, which no gRPC method
answers), and rotation without a restart.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from laminar_base.errors import ConfigError
from laminar_base.security import is_loopback, read_pem
from laminar_base.settings import MetricsSettings, TlsSettings

LISTEN_KEY = "server.metrics_listen"


def check_metrics_exposure(listen: str, metrics: MetricsSettings) -> None:
    """Refuse a non-loopback ``listen`` without HTTPS and client certificates unless
    ``metrics.insecure_allow_remote``: one ConfigError naming the keys (exit 2)."""
    if not listen or is_loopback(listen) or metrics.tls or metrics.insecure_allow_remote:
        return
    raise ConfigError(
        f"{listen} is not a loopback address and metrics (tenant names among them) would be "
        "served to anyone as plain HTTP: set metrics.tls = true (HTTPS with client "
        "certificates; files from [tls] or metrics.cert_file, metrics.key_file, "
        "metrics.client_ca_file), or say metrics.insecure_allow_remote = true",
        field=LISTEN_KEY,
    )


def start_metrics_http(
    listen: str, registry: CollectorRegistry, metrics: MetricsSettings, tls: TlsSettings
) -> tuple[Any, str]:
    """Serve ``registry`` on ``listen`` (HOST:PORT, port 0 picks one) on a thread; returns
    the server (``shutdown()`` it) and the address it serves. Refuses as
    :func:`check_metrics_exposure` does; the config was validated
    (:func:`~laminar_base.settings.validate_metrics`)."""
    check_metrics_exposure(listen, metrics)
    host, _, port = listen.rpartition(":")
    options: dict[str, Any] = {}
    if metrics.tls:
        cert, key, client_ca = metrics.tls_files(tls)
        # Checked as gRPC's are (PEM, a key not readable by others); the server reads them.
        read_pem(cert, "metrics.cert_file" if metrics.cert_file else "tls.cert_file")
        read_pem(key, "metrics.key_file" if metrics.key_file else "tls.key_file", private=True)
        read_pem(client_ca, "metrics.client_ca_file" if metrics.client_ca_file else "tls.ca_file")
        options = {
            "certfile": cert,
            "keyfile": key,
            "client_cafile": client_ca,
            "client_auth_required": True,
        }
    httpd, _thread = start_http_server(int(port), addr=host, registry=registry, **options)
    return httpd, f"{host}:{httpd.server_port}"
