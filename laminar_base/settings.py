"""Settings every daemon shares: mTLS files and shared-secret authentication of control calls,
and who may read the metrics listener."""

from __future__ import annotations

from dataclasses import dataclass, field

from laminar_base.configlib import doc
from laminar_base.errors import ConfigError


def require_readable_file(path: str, key: str) -> None:
    """A credential the daemon reads at start: a missing file, a folder, or one this user
    may not read (a 0700 PKI directory under systemd's DynamicUser) is one ConfigError
    naming ``key``, never a traceback."""
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise ConfigError(f"no such file {path!r}", field=key) from None
    except IsADirectoryError:
        raise ConfigError(f"{path!r} is a directory, not a file", field=key) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path!r}: {exc.strerror}", field=key) from None


@dataclass(frozen=True)
class TlsSettings:
    """mTLS for control traffic; all three files or none (``laminar certs init`` makes them)."""

    ca_file: str = field(
        default="",
        metadata=doc("PEM CA certificate that signed every router and agent; empty = TLS off"),
    )
    cert_file: str = field(
        default="", metadata=doc("PEM certificate of this daemon, signed by tls.ca_file")
    )
    key_file: str = field(
        default="", metadata=doc("PEM private key of tls.cert_file (not readable by others)")
    )
    allowed_names: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "certificate names (CN or SAN) allowed to make control calls, 'router-1,gpu-01'; "
            "empty = any certificate the CA signed"
        ),
    )

    @property
    def is_enabled(self) -> bool:
        return bool(self.ca_file or self.cert_file or self.key_file)


@dataclass(frozen=True)
class ControlSettings:
    """Shared-secret authentication of control calls where TLS is not configured."""

    shared_secret_file: str = field(
        default="",
        metadata=doc(
            "file holding the secret every control call carries (x-laminar-secret); "
            "empty with TLS off = control calls unauthenticated (warned at start)"
        ),
    )
    peer_secret_file: str = field(
        default="",
        metadata=doc(
            "routers only: file holding a second secret that peer zones carry on "
            "ExchangeSummary and ForwardJob (x-laminar-peer-secret); agents never hold it, so "
            "an agent host cannot pose as a peer zone; empty = the control secret suffices"
        ),
    )
    insecure: bool = field(
        default=False,
        metadata=doc(
            "serve on a non-loopback address without authentication (no TLS, no shared "
            "secret; on a router also no auth.tokens_file); without it such a start is refused"
        ),
    )


def validate_security(tls: TlsSettings, control: ControlSettings) -> None:
    """Raise one ConfigError naming the key: partial TLS, or a file that does not exist."""
    if tls.is_enabled:
        for key, value in (
            ("ca_file", tls.ca_file),
            ("cert_file", tls.cert_file),
            ("key_file", tls.key_file),
        ):
            if not value:
                raise ConfigError(
                    "is required when any of tls.ca_file, tls.cert_file, tls.key_file is set",
                    field=f"tls.{key}",
                )
            require_readable_file(value, f"tls.{key}")
    elif tls.allowed_names:
        raise ConfigError(
            "needs mTLS: set tls.ca_file, tls.cert_file, tls.key_file", field="tls.allowed_names"
        )
    if control.shared_secret_file:
        require_readable_file(control.shared_secret_file, "control.shared_secret_file")


@dataclass(frozen=True)
class MetricsSettings:
    """Who may read ``server.metrics_listen``: it serves plain HTTP to anyone who reaches
    it, so beyond loopback it needs HTTPS with client certificates or an explicit opt-in
    (the router's usage counters carry tenant names)."""

    tls: bool = field(
        default=False,
        metadata=doc(
            "serve metrics over HTTPS and require a client certificate signed by "
            "metrics.client_ca_file (a certificate with no Laminar role is enough)"
        ),
    )
    cert_file: str = field(
        default="",
        metadata=doc("PEM certificate of the metrics HTTPS server; empty = tls.cert_file"),
    )
    key_file: str = field(
        default="", metadata=doc("PEM private key of metrics.cert_file; empty = tls.key_file")
    )
    client_ca_file: str = field(
        default="",
        metadata=doc("PEM CA that signed the scrapers' client certificates; empty = tls.ca_file"),
    )
    insecure_allow_remote: bool = field(
        default=False,
        metadata=doc(
            "serve metrics as plain HTTP, unauthenticated, on a non-loopback "
            "server.metrics_listen; without it (or metrics.tls) such a start is refused"
        ),
    )

    def tls_files(self, tls: TlsSettings) -> tuple[str, str, str]:
        """(certificate, private key, client CA) of the HTTPS listener: these keys, or [tls]'s."""
        return (
            self.cert_file or tls.cert_file,
            self.key_file or tls.key_file,
            self.client_ca_file or tls.ca_file,
        )


def validate_metrics(metrics: MetricsSettings, tls: TlsSettings) -> None:
    """Raise one ConfigError naming the key: HTTPS files given without metrics.tls (they
    would be ignored: plain HTTP), or metrics.tls without a file it needs."""
    own = (
        ("metrics.cert_file", metrics.cert_file),
        ("metrics.key_file", metrics.key_file),
        ("metrics.client_ca_file", metrics.client_ca_file),
    )
    if not metrics.tls:
        for key, value in own:
            if value:
                raise ConfigError("is used only with metrics.tls = true", field=key)
        return
    fallbacks = ("tls.cert_file", "tls.key_file", "tls.ca_file")
    for (key, mine), fallback, value in zip(own, fallbacks, metrics.tls_files(tls), strict=True):
        if not value:
            raise ConfigError(f"metrics.tls needs it (or {fallback})", field=key)
        require_readable_file(value, key if mine else fallback)
