"""Router-agent trust, shared by both daemons and the CLI: mTLS or a shared secret.

Control traffic (router -> agent Probe/Commit/Release/Signal/..., agent -> router
Heartbeat, router <-> router ExchangeSummary/ForwardJob) is authenticated in one
of two ways:

* **mTLS** (``[tls]`` ``ca_file``, ``cert_file``, ``key_file``): every daemon
  serves with its certificate, requires a client certificate signed by the CA,
  and calls others with its own. The caller's identity is the certificate's
  common name (or first SAN), read by :func:`peer_identity`.
* **shared secret** (``[control] shared_secret_file``): every control call
  carries ``x-laminar-secret``; :class:`SecretInterceptor` compares it with
  :func:`hmac.compare_digest` and answers UNAUTHENTICATED otherwise. Health and
  reflection are exempt.

Without either, control calls are unauthenticated (the daemons warn at start).
With ``tls.allowed_names``, only certificates carrying one of those names may make
control calls (:class:`NamesInterceptor`); otherwise any certificate the CA signed
may. Not covered: certificate revocation, and rotation without a restart.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import ipaddress
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from laminar_base.errors import ConfigError
from laminar_base.settings import ControlSettings, TlsSettings, validate_security

#: Metadata key that carries the shared secret on control calls.
SECRET_HEADER = "x-laminar-secret"
#: Metadata key that carries the peer-zone secret (routers only) on peer calls.
PEER_SECRET_HEADER = "x-laminar-peer-secret"
#: File mode bits that must be clear on a secret or private key (readable by others).
_OTHERS_BITS = 0o007


def add_security_flags(parser: argparse.ArgumentParser) -> None:
    """The daemons' flags for ``[tls]`` and ``[control]`` (they override TOML and environment)."""
    parser.add_argument("--tls-ca-file", help="PEM CA certificate (tls.ca_file); turns on mTLS")
    parser.add_argument("--tls-cert-file", help="PEM certificate of this daemon (tls.cert_file)")
    parser.add_argument("--tls-key-file", help="PEM private key (tls.key_file)")
    parser.add_argument(
        "--tls-allowed-names",
        help="certificate names allowed to make control calls, comma-separated (tls.allowed_names)",
    )
    parser.add_argument(
        "--shared-secret-file",
        help="file with the secret control calls carry (control.shared_secret_file)",
    )
    parser.add_argument(
        "--insecure",
        action="store_const",
        const=True,
        help="allow serving a non-loopback address without authentication (control.insecure)",
    )


def security_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Flag values for :func:`~laminar_base.configlib.load_config` overrides."""
    return {
        "tls.ca_file": args.tls_ca_file,
        "tls.cert_file": args.tls_cert_file,
        "tls.key_file": args.tls_key_file,
        "tls.allowed_names": args.tls_allowed_names,
        "control.shared_secret_file": args.shared_secret_file,
        "control.insecure": args.insecure,
    }


@dataclass(frozen=True)
class Trust:
    """The loaded credentials a daemon (or the CLI) serves and calls with; empty = insecure."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    secret: str | None = None
    #: Certificate names allowed to make control calls to us; empty = any the CA signed.
    allowed_names: frozenset[str] = frozenset()
    #: The peer-zone secret (routers only): required on peer calls to us when set.
    peer_secret: str | None = None
    #: Whether calls made with this trust carry :attr:`peer_secret` (only calls to peers).
    sends_peer_secret: bool = False

    def for_peers(self) -> Trust:
        """This trust for calls to peer zones: they also carry the peer secret, which
        calls to agents never do (an agent must not learn it)."""
        return dataclasses.replace(self, sends_peer_secret=True)

    @property
    def is_tls(self) -> bool:
        return self.ca is not None

    @property
    def is_authenticated(self) -> bool:
        return self.is_tls or self.secret is not None

    def describe(self) -> str:
        """How control calls are authenticated, for the start-up log line."""
        tls = "mTLS" + (
            f" (allowed names: {', '.join(sorted(self.allowed_names))})"
            if self.allowed_names
            else ""
        )
        parts = (
            ([tls] if self.is_tls else [])
            + (["shared secret"] if self.secret else [])
            + (["peer secret on peer calls"] if self.peer_secret else [])
        )
        return " + ".join(parts) or "none"

    def server_credentials(self) -> grpc.ServerCredentials:
        """Serve with our certificate and require a client certificate signed by the CA."""
        assert self.ca is not None and self.cert is not None and self.key is not None
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        assert self.is_tls
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)

    def headers(self) -> tuple[tuple[str, str], ...]:
        out = ((SECRET_HEADER, self.secret),) if self.secret else ()
        if self.sends_peer_secret and self.peer_secret:
            out = (*out, (PEER_SECRET_HEADER, self.peer_secret))
        return out

    def bind(self, server: grpc.aio.Server, address: str) -> int:
        """Bind ``address`` with TLS when configured; the real port (0: could not bind)."""
        try:
            if self.is_tls:
                return server.add_secure_port(address, self.server_credentials())
            return server.add_insecure_port(address)
        except RuntimeError:  # grpc's "Failed to bind to address ..."
            raise ConfigError(
                f"cannot listen on {address}: the port is in use or the address is not "
                "on this host",
                field="server.listen",
            ) from None

    def aio_channel(
        self, address: str, options: list[tuple[str, Any]] | None = None
    ) -> grpc.aio.Channel:
        """An asyncio channel that authenticates every call the way this trust says."""
        headers = self.headers()
        interceptors: Any = aio_header_interceptors(headers) if headers else None
        if self.is_tls:
            return grpc.aio.secure_channel(
                address, self.channel_credentials(), options=options, interceptors=interceptors
            )
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)

    def channel(
        self,
        address: str,
        options: list[tuple[str, Any]] | None = None,
        extra_headers: Iterable[tuple[str, str]] = (),
    ) -> grpc.Channel:
        """A blocking channel (the CLI) that sends our headers plus ``extra_headers``."""
        if self.is_tls:
            channel = grpc.secure_channel(address, self.channel_credentials(), options=options)
        else:
            channel = grpc.insecure_channel(address, options=options)
        headers = (*self.headers(), *extra_headers)
        if not headers:
            return channel
        return grpc.intercept_channel(channel, Headers(headers))


INSECURE = Trust()


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Write with ``mode`` from the first byte, so a key or secret is never briefly readable."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), mode)
        out.write(data)


def _read(path: str, key: str, *, private: bool = False) -> bytes:
    file = Path(path)
    try:
        data = file.read_bytes()
        mode = file.stat().st_mode & 0o777
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", field=key) from None
    if private and mode & _OTHERS_BITS:
        raise ConfigError(
            f"{path} is readable by others (mode {mode:03o}); run chmod 600 {path}", field=key
        )
    return data


def read_pem(path: str, key: str, *, private: bool = False) -> bytes:
    """A PEM file read at start; errors name ``key`` (a ``private`` one must not be
    readable by others)."""
    data = _read(path, key, private=private)
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{path} is not a PEM file", field=key)
    return data


def _read_secret(path: str, key: str) -> str | None:
    """A secret file's one line (None when ``path`` is empty): private, non-empty, ASCII."""
    if not path:
        return None
    secret = _read(path, key, private=True).decode(errors="replace").strip()
    if not secret:
        raise ConfigError(f"{path} is empty", field=key)
    if not (secret.isascii() and secret.isprintable()) or len(secret) > 1024:
        # gRPC metadata values are printable ASCII; base64 or hex of random bytes is.
        raise ConfigError("must be one line of at most 1024 printable ASCII characters", field=key)
    return secret


def load_trust(tls: TlsSettings, control: ControlSettings) -> Trust:
    """Read the configured files once at start; errors name the key."""
    validate_security(tls, control)
    secret = _read_secret(control.shared_secret_file, "control.shared_secret_file")
    peer_secret = _read_secret(control.peer_secret_file, "control.peer_secret_file")
    if not tls.is_enabled:
        return Trust(secret=secret, peer_secret=peer_secret)
    return Trust(
        ca=read_pem(tls.ca_file, "tls.ca_file"),
        cert=read_pem(tls.cert_file, "tls.cert_file"),
        key=read_pem(tls.key_file, "tls.key_file", private=True),
        secret=secret,
        allowed_names=frozenset(tls.allowed_names),
        peer_secret=peer_secret,
    )


def is_loopback(listen: str) -> bool:
    """Whether a ``HOST:PORT`` listen address is reachable from this host only."""
    host = listen.rpartition(":")[0].strip("[]").lower()
    if host == "localhost" or host == "::1":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(
    trust: Trust,
    listen: str,
    *,
    insecure: bool,
    listen_key: str = "server.listen",
    tokens_file: str | None = None,
) -> None:
    """Refuse to serve a non-loopback address unauthenticated unless ``control.insecure``.

    Control calls need mTLS or the shared secret there; on a router (``tokens_file`` given)
    submitter calls need ``auth.tokens_file`` too. Loopback stays open so that ``laminar
    up``, the demo and tests need no set-up. Raises one ConfigError naming the keys."""
    if insecure or is_loopback(listen):
        return
    if not trust.is_authenticated:
        raise ConfigError(
            f"{listen} is not a loopback address and control calls would be unauthenticated: "
            "set tls.ca_file, tls.cert_file, tls.key_file (laminar certs init) or "
            "control.shared_secret_file, or say control.insecure (--insecure)",
            field=listen_key,
        )
    if tokens_file is not None and not tokens_file:
        raise ConfigError(
            f"{listen} is not a loopback address and submitters would be unauthenticated: "
            "set auth.tokens_file, or say control.insecure (--insecure)",
            field="auth.tokens_file",
        )


def log_trust(log: logging.Logger, trust: Trust, daemon: str, address: str) -> None:
    """One start-up line saying how control calls are authenticated (a WARNING when not)."""
    if trust.is_authenticated:
        log.info(
            "%s control calls on %s are authenticated by %s", daemon, address, trust.describe()
        )
        return
    log.warning(
        "control calls are unauthenticated: any process that can reach %s may act as a "
        "router or agent (%s); set tls.ca_file, tls.cert_file and tls.key_file "
        "(laminar certs init) or control.shared_secret_file",
        address,
        daemon,
    )


def _peer_names(context: Any) -> list[str]:
    """The caller's certificate names, common name first, then every SAN; [] without mTLS."""
    auth = context.auth_context() or {}
    return [
        value.decode() if isinstance(value, bytes) else str(value)
        for key in ("x509_common_name", "x509_subject_alternative_name")
        for value in auth.get(key) or []
    ]


#: Roles a certificate may carry, as SAN URIs ``urn:laminar:role:<role>``.
ROLES = ("router", "agent", "peer", "admin")
ROLE_URI_PREFIX = "urn:laminar:role:"


@functools.lru_cache(maxsize=1024)
def roles_of_certificate(pem: bytes) -> frozenset[str]:
    """The Laminar roles a PEM certificate's SAN URIs carry (``urn:laminar:role:agent``)."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(pem)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return frozenset()
    return frozenset(
        uri[len(ROLE_URI_PREFIX) :]
        for uri in sans.get_values_for_type(x509.UniformResourceIdentifier)
        if uri.startswith(ROLE_URI_PREFIX) and uri[len(ROLE_URI_PREFIX) :] in ROLES
    )


def peer_roles(context: Any) -> frozenset[str]:
    """The caller's roles from its client certificate; empty without mTLS or roles."""
    auth = context.auth_context() or {}
    pems = auth.get("x509_pem_cert") or []
    if not pems:
        return frozenset()
    pem = pems[0] if isinstance(pems[0], bytes) else str(pems[0]).encode()
    return roles_of_certificate(pem)


def peer_names(context: Any) -> list[str]:
    """The caller's certificate names, common name first, then every SAN; [] without mTLS."""
    return _peer_names(context)


def peer_identity(context: Any) -> str:
    """The caller's certificate name (common name, else first SAN); "" without mTLS."""
    names = _peer_names(context)
    return names[0] if names else ""


if TYPE_CHECKING:  # the stubs make these generic; at run time they are plain classes
    Handler = grpc.RpcMethodHandler[Any, Any]
    _ServerBase = grpc.aio.ServerInterceptor[Any, Any]
    _UnaryBase = grpc.UnaryUnaryClientInterceptor[Any, Any]
    _StreamBase = grpc.UnaryStreamClientInterceptor[Any, Any]
    _BidiBase = grpc.StreamStreamClientInterceptor[Any, Any]
    _AioUnaryBase = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    _AioStreamBase = grpc.aio.UnaryStreamClientInterceptor[Any, Any]
    _AioBidiBase = grpc.aio.StreamStreamClientInterceptor[Any, Any]
else:
    Handler = grpc.RpcMethodHandler
    _ServerBase = grpc.aio.ServerInterceptor
    _UnaryBase = grpc.UnaryUnaryClientInterceptor
    _StreamBase = grpc.UnaryStreamClientInterceptor
    _BidiBase = grpc.StreamStreamClientInterceptor
    _AioUnaryBase = grpc.aio.UnaryUnaryClientInterceptor
    _AioStreamBase = grpc.aio.UnaryStreamClientInterceptor
    _AioBidiBase = grpc.aio.StreamStreamClientInterceptor

# ----------------------------------------------------------------------------- server side


Ctx = grpc.aio.ServicerContext[Any, Any]


def _handler_like(handler: Handler, behavior: Callable[..., Any]) -> Handler:
    """A handler of the same shape and (de)serializers as ``handler`` running ``behavior``."""
    kwargs: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behavior, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behavior, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behavior, **kwargs)
    return grpc.unary_unary_rpc_method_handler(behavior, **kwargs)


def _deny_handler(handler: Handler, message: str) -> Handler:
    """A handler of the same shape as ``handler`` that answers UNAUTHENTICATED."""

    async def deny(request: Any, context: Ctx) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return _handler_like(handler, deny)


class _ControlInterceptor(_ServerBase):
    """Applies :meth:`guard` to calls of ``services``; health, reflection and others pass."""

    def __init__(self, services: Iterable[str]) -> None:
        self._prefixes = tuple(f"/{name}/" for name in services)

    def guard(self, handler: Handler, details: grpc.HandlerCallDetails) -> Handler:
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or not method.startswith(self._prefixes):
            return handler
        return self.guard(handler, handler_call_details)


class SecretInterceptor(_ControlInterceptor):
    """Refuse calls to ``services`` that lack the shared secret (UNAUTHENTICATED).

    With ``methods``, only those full method names are checked (the peer secret guards
    ExchangeSummary and ForwardJob, not every control call)."""

    def __init__(
        self,
        secret: str,
        services: Iterable[str],
        *,
        header: str = SECRET_HEADER,
        key: str = "control.shared_secret_file",
        methods: Iterable[str] | None = None,
    ) -> None:
        import hmac  # servers only: the CLI imports this module and checks no secret

        super().__init__(services)
        self._compare_digest = hmac.compare_digest
        self._secret = secret.encode()
        self._header = header
        self._key = key
        self._methods = frozenset(methods) if methods is not None else None

    def check(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
        """None when the secret is right, else what is wrong (the UNAUTHENTICATED message)."""
        for key, value in metadata or ():
            if key.lower() == self._header:
                given = value if isinstance(value, bytes) else value.encode()
                if self._compare_digest(given, self._secret):
                    return None
                return f"wrong {self._header} (check {self._key} on the caller)"
        return f"missing {self._header} metadata: this call needs {self._key} on the caller"

    def guard(self, handler: Handler, details: grpc.HandlerCallDetails) -> Handler:
        if self._methods is not None and details.method not in self._methods:
            return handler
        problem = self.check(details.invocation_metadata)
        return (
            handler if problem is None else _deny_handler(handler, f"{details.method}: {problem}")
        )


class _CallerCheck(_ControlInterceptor):
    """Checks the caller inside each call (the peer certificate is known only there)."""

    code = grpc.StatusCode.PERMISSION_DENIED

    def problem(self, context: Ctx, method: str) -> str | None:
        raise NotImplementedError

    async def _check(self, context: Ctx, method: str) -> None:
        problem = self.problem(context, method)
        if problem is not None:
            await context.abort(self.code, f"{method}: {problem}")

    def guard(self, handler: Handler, details: grpc.HandlerCallDetails) -> Handler:
        method = details.method or ""
        if handler.request_streaming and handler.response_streaming:
            inner_bidi: Any = handler.stream_stream

            async def bidi(requests: Any, context: Ctx) -> AsyncIterator[Any]:
                await self._check(context, method)  # before the first request is read
                async for item in inner_bidi(requests, context):
                    yield item

            return _handler_like(handler, bidi)
        if handler.request_streaming:  # no control call streams requests one way only
            return _deny_handler(handler, f"{method}: client streaming is not a control call")
        if handler.response_streaming:
            inner_stream: Any = handler.unary_stream

            async def stream(request: Any, context: Ctx) -> AsyncIterator[Any]:
                await self._check(context, method)
                async for item in inner_stream(request, context):
                    yield item

            return _handler_like(handler, stream)
        inner: Any = handler.unary_unary

        async def unary(request: Any, context: Ctx) -> Any:
            await self._check(context, method)
            return await inner(request, context)

        return _handler_like(handler, unary)


class NamesInterceptor(_CallerCheck):
    """Let only certificates naming one of ``names`` call ``services`` (PERMISSION_DENIED)."""

    def __init__(self, names: Iterable[str], services: Iterable[str]) -> None:
        super().__init__(services)
        self._names = frozenset(names)

    def problem(self, context: Ctx, method: str) -> str | None:
        names = _peer_names(context)
        if self._names.intersection(names):
            return None
        who = f"certificate {names[0]!r}" if names else "a caller without a certificate"
        return f"{who} may not make control calls (tls.allowed_names)"


class RolesInterceptor(_CallerCheck):
    """Each control method answers only certificates carrying one of its roles.

    ``rules`` maps a full method name (``/laminar.v1.Agent/Probe``) to the roles that may
    call it; a method of ``services`` that has no rule is refused to every role, so a new
    RPC is closed until someone decides who may call it."""

    def __init__(self, rules: Mapping[str, Iterable[str]], services: Iterable[str]) -> None:
        super().__init__(services)
        self._rules = {method: frozenset(roles) for method, roles in rules.items()}

    def problem(self, context: Ctx, method: str) -> str | None:
        allowed = self._rules.get(method, frozenset())
        roles = peer_roles(context)
        if roles & allowed:
            return None
        names = _peer_names(context)
        who = f"certificate {names[0]!r}" if names else "a caller without a certificate"
        has = f"roles {', '.join(sorted(roles))}" if roles else "no Laminar role"
        need = " or ".join(sorted(allowed)) or "no role (not a control call)"
        return (
            f"{who} has {has}; this call needs {need} "
            "(laminar certs init --hosts NAME=ROLE writes the role)"
        )


def server_interceptors(
    trust: Trust,
    services: Iterable[str],
    roles: Mapping[str, Iterable[str]] | None = None,
    peer_methods: Iterable[str] = (),
) -> list[_ServerBase]:
    """The secret check, the allowed-names check, (under mTLS) the role of each control
    method's caller (``roles``: full method name -> roles) and the peer secret on
    ``peer_methods``, each only where configured."""
    services = list(services)
    out: list[_ServerBase] = []
    if trust.secret:
        out.append(SecretInterceptor(trust.secret, services))
    if trust.peer_secret and peer_methods:
        out.append(
            SecretInterceptor(
                trust.peer_secret,
                services,
                header=PEER_SECRET_HEADER,
                key="control.peer_secret_file",
                methods=peer_methods,
            )
        )
    if trust.allowed_names:
        out.append(NamesInterceptor(trust.allowed_names, services))
    if trust.is_tls and roles is not None:
        out.append(RolesInterceptor(roles, services))
    return out


# ----------------------------------------------------------------------------- client side


class Headers(_UnaryBase, _StreamBase, _BidiBase):
    """Blocking-channel interceptor that adds fixed metadata (secret, bearer token) to calls."""

    def __init__(self, headers: Iterable[tuple[str, str]]) -> None:
        self._headers = tuple(headers)

    def _details(self, details: Any) -> Any:
        return details._replace(metadata=[*(details.metadata or []), *self._headers])

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_stream(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        return continuation(self._details(details), request_iterator)


class _AioHeaderAdder:
    def __init__(self, headers: Iterable[tuple[str, str]]) -> None:
        self._headers = tuple(headers)

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._headers)
        return details._replace(metadata=metadata)  # type: ignore[attr-defined,no-any-return]


class AioHeaders(_AioHeaderAdder, _AioUnaryBase):
    """Asyncio-channel interceptor that adds fixed metadata to unary calls. An aio channel
    files each interceptor under the first call kind it implements, so each kind has its
    own class (:func:`aio_header_interceptors` gives all three)."""

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)


class AioStreamHeaders(_AioHeaderAdder, _AioStreamBase):
    """:class:`AioHeaders` for server-streaming calls."""

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)


class AioBidiHeaders(_AioHeaderAdder, _AioBidiBase):
    """:class:`AioHeaders` for calls streaming both ways (the agent's heartbeat stream)."""

    async def intercept_stream_stream(
        self,
        continuation: Any,
        client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


def aio_header_interceptors(headers: Iterable[tuple[str, str]]) -> list[Any]:
    """Interceptors adding ``headers`` to every unary and streaming call of an aio channel."""
    fixed = tuple(headers)
    return [AioHeaders(fixed), AioStreamHeaders(fixed), AioBidiHeaders(fixed)]
