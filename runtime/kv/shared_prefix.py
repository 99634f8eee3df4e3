"""Public prefixes whose KV every cache namespace shares (EngineConfig.shared_prefix_file; off by default).

Namespaces keep tenants' KV apart (runtime/namespace.py), so a system prompt that every tenant sends is
computed and cached once per tenant. An operator may declare such a prefix public: the leading tokens of a
sequence that equal a public prefix's are looked up and stored in one shared namespace, and every token
after the first that differs stays private to the sequence's own namespace.

How, in one radix tree: `locate` maps (tokens, namespace) to (key, SHARED_NAMESPACE), where the key keeps
the public tokens as they are and encodes each later token together with its namespace (`_private`: a
negative int, distinct per (token, namespace), never equal to a token id). Two tenants' sequences thus share
the path of the public prefix, and their continuations are different keys even when their tokens are equal:
a match never runs past the public part into another tenant's tokens, so `cached_tokens` shows another
tenant nothing but the public prefix. Sharing is by position, not by content: the KV of a public token
depends only on the public tokens before it, so the shared path is the KV each tenant would compute.

Every radix tree of a KV owner (the device tree, the host tier's, the evicted-path history) holds the same
`SharedPrefixes`, so a key moves between them already located; `locate` leaves a located key alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..namespace import DEFAULT_NAMESPACE, Namespace

SHARED_NAMESPACE = DEFAULT_NAMESPACE.child("shared", "public")  # tenants' namespaces are "tenant" children
_SALTS = 1 << 32  # namespaces told apart per token: far more than a server has tenants


def _private(token: int, salt: int) -> int:
    """`token` of the namespace numbered `salt`, as a key no other (token, namespace) and no token id has."""
    natural = 2 * token if token >= 0 else -2 * token - 1  # any int, image keys included, to a distinct n >= 0
    return -1 - (natural * _SALTS + salt)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class SharedPrefixes:
    prefixes: list[tuple[int, ...]] = field(default_factory=list)  # public token sequences (non-negative ids)
    _salts: dict[Namespace, int] = field(default_factory=dict)

    def add(self, tokens: Sequence[int]) -> None:
        if not tokens or min(tokens) < 0:
            raise ValueError("a shared prefix must be a non-empty sequence of token ids")
        self.prefixes.append(tuple(tokens))

    def public_len(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` are public: the longest run equal to a public prefix's start."""
        return max((_common(p, tokens) for p in self.prefixes), default=0)

    def locate(self, tokens: Sequence[int], namespace: Namespace) -> tuple[Sequence[int], Namespace]:
        """Where `tokens` of `namespace` live: unchanged when none of it is public, else the shared
        namespace's key for them (public tokens as they are, the rest private to `namespace`)."""
        if namespace == SHARED_NAMESPACE:
            return tokens, namespace  # located already (a path read back from the tree)
        public = self.public_len(tokens)
        if public == 0:
            return tokens, namespace
        salt = self._salts.setdefault(namespace, len(self._salts))
        return [*tokens[:public], *(_private(t, salt) for t in tokens[public:])], SHARED_NAMESPACE
