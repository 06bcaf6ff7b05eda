"""Settings every daemon shares: mTLS files and shared-secret authentication of control calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from laminar_base.configlib import doc
from laminar_base.errors import ConfigError


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
            if not Path(value).is_file():
                raise ConfigError(f"no such file {value!r}", field=f"tls.{key}")
    elif tls.allowed_names:
        raise ConfigError(
            "needs mTLS: set tls.ca_file, tls.cert_file, tls.key_file", field="tls.allowed_names"
        )
    if control.shared_secret_file and not Path(control.shared_secret_file).is_file():
        raise ConfigError(
            f"no such file {control.shared_secret_file!r}", field="control.shared_secret_file"
        )
