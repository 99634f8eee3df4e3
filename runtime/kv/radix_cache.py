"""Radix tree from token-id sequences to the KV slots that hold them.

Invariants (checked by `check`): every node but the root has a non-empty key and a slot tensor of the
same length; a node's lock_ref is the number of locks whose path runs through it (live requests and
pins), its pin_ref the number of pins among them, so lock_ref(parent) >= lock_ref(child) and
pin_ref <= lock_ref; evictable_size + protected_size = total tokens in the tree; idle_pinned_size counts
the tokens locked by pins alone (lock_ref == pin_ref > 0: releasing those pins makes them evictable),
pinned_size those under any pin. A node's want_ref counts the queued requests whose cached prefix runs
through it: not a lock (admission may still evict it), an order: `evict` spares wanted leaves unless told.

Namespaces (runtime/namespace.py): the tree has one root per namespace, made on the first insert into it and
dropped once its last path is evicted; a match, an insert and a pin are keyed by (namespace, tokens), so a
prefix is reused only within its namespace. A root is the one kind of node without a parent: walks up stop
at the first node whose parent is None. `root` is the default namespace's, which always exists. With
`shared` (runtime/kv/shared_prefix.py), a match or an insert first locates its key: the public prefix's
tokens of every namespace share one path.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..namespace import DEFAULT_NAMESPACE, Namespace
from .shared_prefix import SharedPrefixes

_clock = itertools.count()


class TreeNode:
    __slots__ = ("children", "parent", "key", "value", "lock_ref", "pin_ref", "want_ref", "last_access",
                 "namespace")

    def __init__(self, key: list[int], value: torch.Tensor, parent: "TreeNode | None",
                 namespace: Namespace | None = None):
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.lock_ref = 0
        self.pin_ref = 0
        self.want_ref = 0
        self.last_access = next(_clock)
        self.namespace = namespace  # a root's namespace; None below the roots

    def __lt__(self, other: "TreeNode") -> bool:
        return self.last_access < other.last_access

    @property
    def up(self) -> "TreeNode":
        """The parent of a node below the root (walks up stop at the root, the one node without one)."""
        assert self.parent is not None, "the root has no parent"
        return self.parent


@dataclass(slots=True)
class PrefixMatch:
    slots: torch.Tensor  # KV slots of the matched prefix, in order
    node: TreeNode  # the deepest node of the match; lock it while the prefix is in use

    @property
    def length(self) -> int:
        return int(self.slots.numel())


def _common_len(edge: Sequence[int], key: Sequence[int], start: int) -> int:
    """How many leading tokens of `edge` equal key[start:] (without copying the key)."""
    n = min(len(edge), len(key) - start)
    i = 0
    while i < n and edge[i] == key[start + i]:
        i += 1
    return i


class RadixCache:
    def __init__(self, free_slots: Callable[[torch.Tensor], None], disable: bool = False,
                 device: torch.device | str = "cpu"):
        self.free_slots = free_slots
        self.on_evict: Callable[[TreeNode], None] | None = None  # sees each leaf before its slots are freed
        self.disable = disable
        self.device = torch.device(device)
        self.shared: SharedPrefixes | None = None  # public prefixes every namespace shares
        self.reset()

    def reset(self) -> None:
        self.root = self._new_root(DEFAULT_NAMESPACE)
        self.roots: dict[Namespace, TreeNode] = {DEFAULT_NAMESPACE: self.root}
        self.evictable_size = 0
        self.protected_size = 0
        self.idle_pinned_size = 0
        self.pinned_size = 0

    def _new_root(self, namespace: Namespace) -> TreeNode:
        root = TreeNode([], self._empty(), None, namespace)
        root.lock_ref = 1  # never evicted
        return root

    def root_of(self, namespace: Namespace = DEFAULT_NAMESPACE) -> TreeNode:
        """The namespace's root; one not in the tree yet gets a root that is not linked in (a match there is
        empty, a lock on it is a no-op), so a lookup never grows the tree."""
        return self.roots.get(namespace) or self._new_root(namespace)

    def namespace_of(self, node: TreeNode) -> Namespace:
        """The namespace whose tree holds `node` (the root of its path's)."""
        while node.parent is not None:
            node = node.parent
        assert node.namespace is not None, "a root carries its namespace"
        return node.namespace

    @property
    def namespaces(self) -> list[Namespace]:
        """The namespaces the tree holds a path of (and the default one, always)."""
        return list(self.roots)

    def _empty(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    # ---- lookup / insert --------------------------------------------------------------------
    def match_prefix(self, key: Sequence[int], namespace: Namespace = DEFAULT_NAMESPACE) -> PrefixMatch:
        """Longest cached prefix of `key` in `namespace`; splits an edge so the match ends exactly at a node."""
        if self.disable:
            return PrefixMatch(self._empty(), self.root)
        if self.shared is not None:
            key, namespace = self.shared.locate(key, namespace)
        root = self.root_of(namespace)
        if not key or not root.children:
            return PrefixMatch(self._empty(), root)
        node, _, values = self._descend(key, root)
        return PrefixMatch(torch.cat(values) if values else self._empty(), node)

    def insert(self, key: Sequence[int], slots: torch.Tensor, namespace: Namespace = DEFAULT_NAMESPACE) -> int:
        """Cache `key` -> `slots` in `namespace`; returns how many leading tokens were cached already.

        The caller owns `slots[:returned]` still (duplicates of what the tree holds) and must free
        those it does not share with the tree; the rest now belong to the tree.
        """
        if self.disable or not key:
            return 0
        assert len(key) == slots.numel(), "key and slots differ in length"
        if self.shared is not None:
            key, namespace = self.shared.locate(key, namespace)
        root = self.roots.get(namespace)
        if root is None:
            root = self.roots[namespace] = self._new_root(namespace)
        node, pos, _ = self._descend(key, root)
        if pos < len(key):
            leaf = TreeNode(list(key[pos:]), slots[pos:].clone(), node)
            node.children[key[pos]] = leaf
            self.evictable_size += len(leaf.key)  # a fresh leaf has no lock of its own
        return pos

    def _descend(self, key: Sequence[int], root: TreeNode) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """Walk down from `root` along `key`, splitting the last edge at the divergence and refreshing LRU
        times. Returns the deepest node reached, how many tokens matched, and the slots on the way."""
        node, pos, values = root, 0, []
        node.last_access = next(_clock)
        while pos < len(key) and key[pos] in node.children:
            child = node.children[key[pos]]
            n = _common_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = next(_clock)
            values.append(child.value)
            node, pos = child, pos + n
        return node, pos, values

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child`'s edge after n tokens; returns the new upper node."""
        parent = child.up
        upper = TreeNode(child.key[:n], child.value[:n], parent)
        upper.lock_ref, upper.pin_ref, upper.last_access = child.lock_ref, child.pin_ref, child.last_access
        upper.want_ref = child.want_ref
        upper.children[child.key[n]] = child
        parent.children[child.key[0]] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        return upper

    def touch(self, node: TreeNode) -> None:
        """Marks the path root..node used now (the young end of the LRU), deepest node youngest."""
        path = []
        while node.parent is not None:
            path.append(node)
            node = node.up
        for node in reversed(path):
            node.last_access = next(_clock)

    # ---- locking ----------------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode, pin: bool = False) -> None:
        """Locks the path from `node` up to the root; `pin`: the lock is a pin (runtime/kv/pins.py)."""
        self._add_lock(node, 1, int(pin))

    def dec_lock_ref(self, node: TreeNode, pin: bool = False) -> None:
        self._add_lock(node, -1, -int(pin))

    def _add_lock(self, node: TreeNode | None, locks: int, pins: int) -> None:
        while node is not None and node.parent is not None:
            n = len(node.key)
            self._account(node, -n)
            node.lock_ref += locks
            node.pin_ref += pins
            assert 0 <= node.pin_ref <= node.lock_ref, "lock_ref / pin_ref underflow"
            self._account(node, n)
            node = node.parent

    def _account(self, node: TreeNode, n: int) -> None:
        """Adds n tokens (negative: removes) to the size counters of `node`'s class."""
        if node.lock_ref == 0:
            self.evictable_size += n
            return
        self.protected_size += n
        if node.pin_ref:
            self.pinned_size += n
            if node.pin_ref == node.lock_ref:
                self.idle_pinned_size += n

    def want(self, node: TreeNode | None, n: int) -> None:
        """A queued request will hit the path root..node (n=1), or no longer waits for it (n=-1). The path
        may have been evicted since: its nodes keep their parent links, so the walk still ends at the root."""
        while node is not None and node.parent is not None:
            node.want_ref += n
            assert node.want_ref >= 0, "want_ref underflow"
            node = node.parent

    # ---- eviction ---------------------------------------------------------------------------
    def evict(self, num_tokens: int, wanted: bool = True, where: Callable[[Namespace], bool] | None = None) -> int:
        """Free least-recently-used unlocked leaves until `num_tokens` slots are freed (or none left);
        `wanted=False` spares the leaves a queued request will hit; `where`: only in the namespaces it accepts."""
        if self.disable or num_tokens <= 0:
            return 0
        heap = [n for n in self.nodes() if not n.children and n.lock_ref == 0 and (wanted or not n.want_ref)
                and (where is None or where(self.namespace_of(n)))]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)
            if self.on_evict is not None:
                self.on_evict(leaf)
            self.free_slots(leaf.value)
            freed += len(leaf.key)
            self.evictable_size -= len(leaf.key)
            parent = leaf.up
            del parent.children[leaf.key[0]]
            if parent.parent is None:  # a root: a namespace's last path is gone, and its root with it
                if not parent.children and parent is not self.root:
                    assert parent.namespace is not None
                    self.roots.pop(parent.namespace, None)
            elif not parent.children and parent.lock_ref == 0 and (wanted or not parent.want_ref):
                heapq.heappush(heap, parent)
        return freed

    # ---- introspection ----------------------------------------------------------------------
    def nodes(self) -> list[TreeNode]:
        """Every node below the roots, of every namespace."""
        out, stack = [], [c for root in self.roots.values() for c in root.children.values()]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def path_slots(self, node: TreeNode) -> torch.Tensor:
        """Slots from the root down to `node`, in token order."""
        values = []
        while node.parent is not None:
            values.append(node.value)
            node = node.up
        return torch.cat(values[::-1]) if values else self._empty()

    def path_key(self, node: TreeNode) -> list[int]:
        """Tokens from the root down to `node`."""
        keys = []
        while node.parent is not None:
            keys.append(node.key)
            node = node.up
        return [t for key in reversed(keys) for t in key]

    def all_slots(self) -> torch.Tensor:
        values = [n.value for n in self.nodes()]
        return torch.cat(values) if values else self._empty()

    def check(self) -> None:
        counted = RadixCache(self.free_slots)
        assert self.roots.get(DEFAULT_NAMESPACE) is self.root, "the default namespace's root moved"
        for namespace, root in self.roots.items():
            assert root.parent is None and root.namespace == namespace and root.lock_ref == 1, "bad root"
            assert root is self.root or root.children, f"namespace {namespace} kept an empty root"
        for node in self.nodes():
            assert node.key and len(node.key) == node.value.numel(), "node key/value mismatch"
            parent = node.up
            assert parent.children.get(node.key[0]) is node, "broken parent link"
            assert node.namespace is None, "a root below a root"
            top = parent.parent is None
            assert top or parent.lock_ref >= node.lock_ref, "lock order"
            assert top or parent.pin_ref >= node.pin_ref, "pin order"
            assert 0 <= node.pin_ref <= node.lock_ref, "pin_ref exceeds lock_ref"
            assert top or parent.want_ref >= node.want_ref, "want order"
            counted._account(node, len(node.key))
        sizes = ("evictable_size", "protected_size", "idle_pinned_size", "pinned_size")
        counts = [getattr(counted, k) for k in sizes]
        tracked = [getattr(self, k) for k in sizes]
        assert counts == tracked, f"size accounting drifted: counted {counts}, tracked {tracked} ({sizes})"

    def contains(self, node: TreeNode) -> bool:
        """Whether `node` is still linked into the tree (not evicted)."""
        while node.parent is not None:
            if node.parent.children.get(node.key[0]) is not node:
                return False
            node = node.parent
        return node.namespace is not None and self.roots.get(node.namespace) is node
