"""Who may use the server: API keys, the admin key, tenants and their cache namespaces, per-tenant caps.

With no key configured the server is open, as before, and every request is the one anonymous tenant in
the default cache namespace (no check runs). With keys, `Authentication` (an ASGI middleware) answers 401
to a request without a valid key (`Authorization: Bearer KEY` or `x-api-key: KEY`) on every route but the
probes, 403 to a tenant key on the routes that act on the server itself (`ADMIN_PATHS`), and 429 with
`Retry-After` to a tenant past its cap on requests in flight (POSTs that start work: generation, programs,
tokenizing; reads and aborts are not counted). Routes read the caller with `tenant_of`.

Keys are compared in constant time (`hmac.compare_digest`) and never logged; a tenant named by no keys file
is known by a hash of its key, never the key itself.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

from ..runtime.namespace import DEFAULT_NAMESPACE, Namespace
from .errors import error_body

if TYPE_CHECKING:
    from fastapi import Request
    from starlette.types import ASGIApp, Receive, Scope, Send

logger = logging.getLogger(__name__)

KEY_ENV = "RADIXLANG_API_KEY"  # a tenant key (serve) / the key a client sends (the CLI, rl.Endpoint)
ADMIN_KEY_ENV = "RADIXLANG_ADMIN_API_KEY"  # the admin key (serve; the fleet hands it to its workers this way)
# probes a load balancer or Kubernetes calls without credentials
OPEN_PATHS = frozenset({"/health", "/health_generate", "/healthz", "/readyz", "/livez"})
# routes that act on the server rather than on one's own requests: the admin key only
ADMIN_PATHS = frozenset({"/flush_cache", "/start_profile", "/stop_profile", "/v1/loads", "/get_load",
                         "/load_lora_adapter", "/unload_lora_adapter", "/update_weights_from_disk",
                         "/update_weights_from_tensor", "/update_weights_from_distributed", "/pause_generation",
                         "/continue_generation"})
RETRY_AFTER_S = 1  # a tenant at its cap is told to come back after this many seconds
# POSTs that end work rather than start it: a tenant at its cap may still send them
UNCAPPED_PATHS = frozenset({"/abort", "/v1/prompt_cache/release"})


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who sent a request: `id` names it in scoped names (sessions, request ids); `namespace` is the
    part of the radix cache its requests reuse KV from."""

    id: str
    namespace: Namespace
    admin: bool = False

    @property
    def anonymous(self) -> bool:
        return not self.id

    def scoped(self, name: str) -> str:
        """A client-chosen name (a prompt_cache_key) as this tenant's own: another tenant's same string
        names another thing. The anonymous tenant's names are global, as without keys."""
        return name if self.anonymous else f"{self.id}\x1f{name}"


ANONYMOUS = Tenant("", DEFAULT_NAMESPACE, admin=True)  # a server without keys: everyone, with every right


def key_tenant_id(key: str) -> str:
    """The tenant of a key that names none: a hash of the key (the key itself never leaves this module)."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass
class AuthConfig:
    """The server's keys: each tenant key -> its tenant's id, and the admin keys. Empty: an open server."""

    keys: dict[str, str] = field(default_factory=dict)  # tenant key -> tenant id
    admin_keys: tuple[str, ...] = ()
    max_requests_per_tenant: int = 0  # requests in flight per tenant; 0: no cap

    def __post_init__(self) -> None:
        for key in [*self.keys, *self.admin_keys]:
            if not key or key != key.strip() or any(c.isspace() for c in key):
                raise ValueError("an API key must be a non-empty string without whitespace")
        if self.max_requests_per_tenant < 0:
            raise ValueError(f"max_requests_per_tenant must be >= 0, got {self.max_requests_per_tenant}")
        # (digest of the key, tenant), scanned in full on each lookup: digests of equal length, so neither
        # the time nor its length depends on which key matched or how much of one did
        self._entries = [(_digest(k), Tenant(t, DEFAULT_NAMESPACE.child("tenant", t))) for k, t in self.keys.items()]
        self._entries += [(_digest(k), Tenant("admin", DEFAULT_NAMESPACE.child("tenant", "admin"), admin=True))
                          for k in self.admin_keys]

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def identify(self, key: str | None) -> Tenant | None:
        """The tenant of `key`, or None for a missing or unknown key. Constant time in the key's content."""
        if key is None:
            return None
        given, found = _digest(key), None
        for known, tenant in self._entries:
            if hmac.compare_digest(given, known) and found is None:
                found = tenant
        return found

    @classmethod
    def from_options(cls, api_keys: Iterable[str] = (), keys_file: str | None = None,
                     admin_key: str | None = None, max_requests_per_tenant: int = 0,
                     environ: Mapping[str, str] = os.environ) -> AuthConfig:
        """`serve`'s options: --api-key (repeatable), --api-keys-file, --admin-api-key, and the
        RADIXLANG_API_KEY / RADIXLANG_ADMIN_API_KEY environment variables."""
        keys = {k: key_tenant_id(k) for k in api_keys}
        if environ.get(KEY_ENV):
            keys.setdefault(environ[KEY_ENV], key_tenant_id(environ[KEY_ENV]))
        if keys_file is not None:
            keys |= read_keys_file(Path(keys_file))
        admin = admin_key or environ.get(ADMIN_KEY_ENV) or None
        if admin is not None and admin in keys:
            raise ValueError("the admin key must differ from every tenant key")
        return cls(keys, (admin,) if admin else (), max_requests_per_tenant)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def read_keys_file(path: Path) -> dict[str, str]:
    """One key a line, optionally followed by its tenant's name (`KEY TENANT`: several keys may share a
    tenant, and so its cache); blank lines and lines starting with # are skipped."""
    keys: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) > 2:
            raise ValueError(f"{path}:{number}: expected `KEY` or `KEY TENANT`, got {len(words)} words")
        keys[words[0]] = words[1] if len(words) == 2 else key_tenant_id(words[0])
    if not keys:
        raise ValueError(f"{path} holds no API key")
    return keys


def request_key(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The key a request carries: `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY`
    (Anthropic's). Two different keys in one request are no key: which one to believe would be a guess (a
    proxy that adds its own key in front of the client's, as sglang-router's --api-key does, would make
    every request its key's)."""
    found: set[str] = set()
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                found.add(token.strip())
        elif name == b"x-api-key" and value.strip():
            found.add(value.decode("latin-1").strip())
    return found.pop() if len(found) == 1 else None


class Authentication:
    """The ASGI middleware in front of every route of a server with keys (see the module's docstring).
    It counts a tenant's request in flight until its response (a stream's last event) is sent."""

    def __init__(self, app: ASGIApp, config: AuthConfig):
        self.app, self.config = app, config
        self.in_flight: Counter[str] = Counter()  # tenant id -> requests (event loop only)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        tenant = self.config.identify(request_key(scope["headers"]))
        if tenant is None:
            await _refuse(send, 401, "invalid or missing API key: send `Authorization: Bearer KEY`",
                          "authentication_error", {"www-authenticate": "Bearer"})
            return
        if scope["path"] in ADMIN_PATHS and not tenant.admin:
            await _refuse(send, 403, f"{scope['path']} acts on the whole server and needs the admin key",
                          "permission_error")
            return
        scope.setdefault("state", {})["tenant"] = tenant
        cap = self.config.max_requests_per_tenant
        if tenant.admin or not cap or scope["method"] != "POST" or scope["path"] in UNCAPPED_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight[tenant.id] >= cap:
            await _refuse(send, 429, f"this key has {cap} requests in flight, its limit (max_requests_per_tenant); "
                                     "retry once one finishes", "rate_limit_error",
                          {"retry-after": str(RETRY_AFTER_S)})
            return
        self.in_flight[tenant.id] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[tenant.id] -= 1
            if not self.in_flight[tenant.id]:
                del self.in_flight[tenant.id]


async def _refuse(send: Send, status: int, message: str, kind: str, headers: Mapping[str, str] | None = None) -> None:
    body = json.dumps(error_body(status, message, kind=kind)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def tenant_of(request: Request) -> Tenant:
    """The tenant that sent `request`: the one its key names, or ANONYMOUS on a server without keys."""
    return getattr(request.state, "tenant", ANONYMOUS)


def require_admin(request: Request, what: str) -> None:
    """Refuses (403) a tenant key an action on the whole server that a route's body asks for (abort_all)."""
    from .errors import APIError

    if not tenant_of(request).admin:
        raise APIError(403, f"{what} acts on the whole server and needs the admin key", kind="permission_error")


def warn_if_open(host: str, config: AuthConfig) -> None:
    """`serve` on an address other machines reach, without keys: anyone there may use (and flush) it."""
    if not config.enabled and host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("serving on %s without API keys: anyone who reaches this port may use the server, flush "
                       "its cache and read cache timings. Pass --api-key / --api-keys-file (and --admin-api-key)",
                       host)
