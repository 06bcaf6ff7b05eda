"""`laminar certs init`: a small CA and one certificate per host for mTLS between daemons.

Meant for a test cluster or a small fleet: every host certificate carries both
server and client usage (a router calls agents and agents call the router) and
names the host plus ``localhost`` and ``127.0.0.1``. Keys are EC P-256, written
mode 0600. An existing ``ca.pem``/``ca-key.pem`` in the folder is reused, so
running it again with new names adds hosts to the same fleet.

Each certificate carries the roles its holder plays (``--hosts NAME=ROLE[+ROLE]``),
written as SAN URIs ``urn:laminar:role:ROLE``: ``router`` (places work on agents),
``agent`` (heartbeats to its router), ``peer`` (a zone that exchanges summaries and
forwards jobs), ``admin`` (an operator: reads, drains, signals). Under mTLS every control
call checks the caller's role (docs/security.md); a certificate without a role makes
no control call.

Not covered: revocation lists, intermediate CAs, renewal reminders. A fleet with
its own PKI should issue certificates there and only point ``[tls]`` at them.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import re
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from rich.console import Console
from rich.table import Table

from laminar_base.errors import InvalidArgument
from laminar_base.security import ROLE_URI_PREFIX, ROLES, write_file

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
#: Names every host certificate carries besides its own, so loopback clusters verify.
LOOPBACK_NAMES = ("localhost", "127.0.0.1")
MAX_DAYS = 3650
_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,252})$")
#: Certificates may be slightly in the future on a host whose clock lags.
_BACKDATE = datetime.timedelta(hours=1)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Laminar"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


_KEY_USAGES = (
    "digital_signature",
    "content_commitment",
    "key_encipherment",
    "data_encipherment",
    "key_agreement",
    "key_cert_sign",
    "crl_sign",
    "encipher_only",
    "decipher_only",
)


def _key_usage(*allowed: str) -> x509.KeyUsage:
    """A KeyUsage extension with only ``allowed`` set."""
    return x509.KeyUsage(**{name: name in allowed for name in _KEY_USAGES})


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    days: int,
    now: datetime.datetime,
) -> x509.CertificateBuilder:
    """Subject, issuer, key, serial and validity (backdated an hour for lagging clocks)."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def split_roles(item: str) -> tuple[str, tuple[str, ...]]:
    """``NAME=ROLE+ROLE`` as (name, roles); a bare name has no role."""
    name, sep, roles_text = item.partition("=")
    roles = tuple(r.strip() for r in roles_text.split("+") if r.strip()) if sep else ()
    for role in roles:
        if role not in ROLES:
            raise InvalidArgument(
                f"{item!r}: role {role!r} is not one of {', '.join(ROLES)}", field="--hosts"
            )
    if sep and not roles:
        raise InvalidArgument(f"{item!r}: name a role after '='", field="--hosts")
    return name.strip(), roles


def with_default_roles(hosts: list[str], roles_text: str) -> list[str]:
    """``hosts`` with each bare name given ``roles_text`` (``--role agent``): the short way to
    issue many certificates of one role. Names that say their own roles keep them."""
    try:
        _, roles = split_roles(f"x={roles_text}")
    except InvalidArgument as exc:
        raise InvalidArgument(exc.message.split(": ", 1)[-1], field="--role") from None
    return [h if "=" in h else f"{h}={'+'.join(roles)}" for h in hosts]


def parse_hosts(text: str) -> list[str]:
    """Comma-separated ``NAME[=ROLE[+ROLE]]`` items (host names or IP addresses),
    deduplicated in order by name."""
    hosts: list[str] = []
    names: set[str] = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _ = split_roles(item)
        if not _HOST_RE.match(name):
            raise InvalidArgument(f"{name!r} is not a host name or IP address", field="--hosts")
        if name not in names:
            names.add(name)
            hosts.append(item)
    if not hosts:
        raise InvalidArgument("name at least one host", field="--hosts")
    return hosts


def _load_or_create_ca(
    folder: Path, days: int, now: datetime.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, bool]:
    """The CA in ``folder`` if both files are there, else a new one; (cert, key, created)."""
    cert_path, key_path = folder / CA_CERT, folder / CA_KEY
    if cert_path.is_file() and key_path.is_file():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise InvalidArgument(f"{key_path} is not an EC key made by certs init", field="--dir")
        return cert, key, False
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("Laminar CA")
    cert = (
        _builder(name, name, key, days, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage("digital_signature", "key_cert_sign", "crl_sign"), critical=True)
        .sign(key, hashes.SHA256())
    )
    write_file(key_path, _key_pem(key), 0o600)
    write_file(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key, True


def issue_host(
    host: str,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    days: int,
    now: datetime.datetime,
    roles: tuple[str, ...] = (),
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for ``host``: CN and SAN name it, plus loopback names,
    and its ``roles`` as SAN URIs."""
    key = ec.generate_private_key(ec.SECP256R1())
    names = [host, *(n for n in LOOPBACK_NAMES if n != host)]
    general: list[x509.GeneralName] = [_general_name(n) for n in names]
    general += [x509.UniformResourceIdentifier(ROLE_URI_PREFIX + r) for r in roles]
    cert = (
        _builder(_name(host), ca_cert.subject, key, days, now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage("digital_signature", "key_encipherment"), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(general), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def init_certs(folder: Path, hosts: list[str], days: int = 365) -> list[tuple[str, Path, Path]]:
    """Create (or reuse) the CA in ``folder`` and write ``HOST.pem``/``HOST-key.pem`` per host
    (``hosts`` items are ``NAME[=ROLE[+ROLE]]``).

    Returns (host, certificate path, key path) rows, the CA first as host ``ca``.
    """
    named = [split_roles(h) for h in hosts]
    if not 1 <= days <= MAX_DAYS:
        raise InvalidArgument(f"must be between 1 and {MAX_DAYS}", field="--days")
    if CA_CERT.removesuffix(".pem") in [name for name, _ in named]:
        raise InvalidArgument("'ca' is reserved for the CA's own files", field="--hosts")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.UTC)
    ca_cert, ca_key, _ = _load_or_create_ca(folder, days, now)
    rows = [("ca", folder / CA_CERT, folder / CA_KEY)]
    for host, roles in named:
        cert_pem, key_pem = issue_host(host, ca_cert, ca_key, days, now, roles)
        cert_path, key_path = folder / f"{host}.pem", folder / f"{host}-key.pem"
        write_file(key_path, key_pem, 0o600)
        write_file(cert_path, cert_pem, 0o644)
        rows.append((host, cert_path, key_path))
    return rows


def cmd_certs_init(args: argparse.Namespace, console: Console) -> int:
    hosts = parse_hosts(args.hosts)
    if args.role:
        hosts = with_default_roles(hosts, args.role)
    folder = Path(args.dir)
    reused = (folder / CA_CERT).is_file() and (folder / CA_KEY).is_file()
    rows = init_certs(folder, hosts, args.days)
    table = Table(title=f"certificates in {folder}", title_justify="left")
    for column in ("for", "certificate", "key (mode 0600)"):
        table.add_column(column)
    for host, cert, key in rows:
        table.add_row(host + (" (reused)" if host == "ca" and reused else ""), str(cert), str(key))
    console.print(table)
    for host in hosts:
        if "=" not in host:
            console.print(
                f"{host}: no role, so this certificate may make no control call "
                "(give one with NAME=ROLE or --role)",
                highlight=False,
            )
    first = split_roles(hosts[0])[0]
    console.print(
        "on each host, in laminar-agent.toml and laminar-zone.toml:\n"
        f'  [tls]\n  ca_file = "{folder / CA_CERT}"\n'
        f'  cert_file = "{folder / (first + ".pem")}"   # this host\'s own\n'
        f'  key_file = "{folder / (first + "-key.pem")}"\n'
        "keep ca-key.pem off the fleet; clients use --ca-file, --cert-file, --key-file",
        highlight=False,
    )
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    certs = sub.add_parser("certs", help="certificates for mTLS between routers and agents")
    certs_sub = certs.add_subparsers(dest="certs_command", metavar="ACTION", required=True)
    init = certs_sub.add_parser(
        "init", help="create a CA (or reuse the one in DIR) and one certificate per host"
    )
    init.add_argument("--dir", required=True, help="output folder (created mode 0700)")
    init.add_argument(
        "--hosts",
        required=True,
        help="NAME=ROLE[+ROLE] per host, comma-separated, roles router, agent, peer, admin: "
        "router-1=router+peer,gpu-01=agent,ops=admin (a bare name gets --role, else none)",
    )
    init.add_argument(
        "--role",
        help="ROLE[+ROLE] for every bare name in --hosts: --role agent --hosts gpu-01,gpu-02",
    )
    init.add_argument(
        "--days", type=int, default=365, help="validity of new certificates (default 365)"
    )
    init.set_defaults(func=cmd_certs_init, is_offline=True)
