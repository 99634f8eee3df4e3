"""Cache namespaces: the radix tree has one root per namespace, and KV is reused only within one.

A namespace is an opaque, hashable value that a request carries from the edge (Submission -> Req) to the
KV owner. The server makes one per tenant (an API key); the same mechanism keeps apart KV that must not
be shared for other reasons (a LoRA adapter, a weight version), by composing parts:
`DEFAULT_NAMESPACE.child("tenant", t).child("adapter", a)`. The runtime never reads the parts: two
namespaces share KV exactly when they are equal.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Namespace:
    """Where a request's KV may be reused: equal namespaces share prefixes, distinct ones never do."""

    parts: tuple[tuple[str, str], ...] = ()  # (kind, value) pairs, outermost first; () is the default

    def child(self, kind: str, value: str) -> Namespace:
        """A namespace inside this one (a tenant's adapter, say): shares nothing with it."""
        return Namespace((*self.parts, (kind, value)))

    @property
    def tenant(self) -> Namespace:
        """The outermost namespace: whose share (fair scheduling, pinned KV) this one counts against; an
        adapter's namespace nested in a tenant's counts as the tenant's."""
        return Namespace(self.parts[:1])

    @property
    def is_default(self) -> bool:
        return not self.parts

    def __str__(self) -> str:
        return "/".join(f"{k}={v}" for k, v in self.parts) or "default"


DEFAULT_NAMESPACE = Namespace()  # every request without one: a server without API keys shares one tree
