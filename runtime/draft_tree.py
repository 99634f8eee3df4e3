"""A draft token tree (a leaf: step data that the request, the batch, the output processor and the drafters
share) and the pure functions over it: paths, constraint states, pruning, acceptance.

A draft is a list of nodes, each a token with the index of its parent node (-1: the request's last
verified token, the root). Parents come before children, so any prefix of the nodes is a tree too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

S = TypeVar("S")  # a constraint's state: whatever its `advance` takes and returns

JUMP_FORWARD = "jump_forward"  # a constraint's forced string: a one-branch draft
DRAFTER = "drafter"  # the speculative drafter (n-gram or draft model)


@dataclass(slots=True)
class Draft:
    """A request's unverified draft: node tokens after its verified output, checked at its next step."""

    tokens: list[int]
    parents: list[int]  # node i's parent node; -1: the root
    source: str  # JUMP_FORWARD | DRAFTER


@dataclass(slots=True)
class DraftTree:
    """What a drafter proposes: node tokens and parents (parents[i] < i)."""

    tokens: list[int]
    parents: list[int]


def chain(n: int) -> list[int]:
    """The parents of an n-node draft in which each token follows the one before it."""
    return list(range(-1, n - 1))


def item_parents(length: int, parents: list[int]) -> list[int]:
    """Parents within a scheduled item of `length` tokens whose last len(parents) are draft nodes: the
    rest are a chain, and a root child hangs from the last of them (the last verified token)."""
    prefix = length - len(parents)
    assert prefix >= 1, "the root (the last verified token) is computed with its draft"
    return chain(prefix) + [prefix - 1 if p < 0 else prefix + p for p in parents]


def depths(parents: list[int]) -> list[int]:
    """Each node's depth below the root (0: a child of the root)."""
    out: list[int] = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


def paths(tokens: list[int], parents: list[int]) -> list[tuple[int, ...]]:
    """The tokens from the root to each row: [()] for the root, then one per node."""
    out: list[tuple[int, ...]] = [()]
    for token, p in zip(tokens, parents):
        out.append(out[p + 1] + (token,))
    return out


def constraint_states(start: S, advance: Callable[[S, int], S | None], tokens: list[int],
                      parents: list[int]) -> list[S]:
    """The constraint state at the root and after each node (every node must follow the constraint)."""
    states = [start]
    for token, p in zip(tokens, parents):
        nxt = advance(states[p + 1], token)
        assert nxt is not None, "a drafted token follows the constraint"
        states.append(nxt)
    return states


def prune(tree: DraftTree, keep: Callable[[int, int], bool]) -> DraftTree:
    """Drops every node for which keep(node index, new parent index) is False, with its subtree; `keep`
    sees nodes in order, parents first, and the surviving parent's new index (-1: the root)."""
    new_index: dict[int, int] = {-1: -1}
    tokens: list[int] = []
    parents: list[int] = []
    for i, (token, p) in enumerate(zip(tree.tokens, tree.parents)):
        if p not in new_index or not keep(i, new_index[p]):
            continue
        new_index[i] = len(tokens)
        tokens.append(token)
        parents.append(new_index[p])
    return DraftTree(tokens, parents)


def allowed_tree(tree: DraftTree, stop_ids: frozenset[int], start: S,
                 advance: Callable[[S, int], S | None] | None) -> DraftTree:
    """`tree` without nodes under a stop token nor, given a constraint (its state at the root and its
    `advance`), nodes that the constraint forbids: what verification could never accept."""
    kept: list[int] = []  # new index -> old index
    states = {-1: start}

    def keep(i: int, parent: int) -> bool:
        if parent >= 0 and tree.tokens[kept[parent]] in stop_ids:
            return False
        if advance is not None:
            state = advance(states[parent], tree.tokens[i])
            if state is None:
                return False
            states[len(kept)] = state
        kept.append(i)
        return True

    return prune(tree, keep)


def with_ancestors(parents: list[int], nodes: list[int]) -> list[int]:
    """`nodes` and all their ancestors, ascending (so parents come first)."""
    out: set[int] = set()
    for node in nodes:
        while node >= 0 and node not in out:
            out.add(node)
            node = parents[node]
    return sorted(out)


def subtree(tokens: list[int], parents: list[int], nodes: list[int]) -> DraftTree:
    """The tree of `nodes` (ascending, closed under parents), renumbered."""
    new_index = {-1: -1}
    for i, node in enumerate(nodes):
        new_index[node] = i
    return DraftTree([tokens[n] for n in nodes], [new_index[parents[n]] for n in nodes])


def best_nodes(scores: list[float], budget: int) -> list[int]:
    """The `budget` highest-scoring nodes, ascending. With scores that never grow from a parent to its
    child (cumulative log-probabilities) and ties going to the earlier node, they are closed under
    parents: a tree."""
    return sorted(sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:budget])


def accept_path(tokens: list[int], parents: list[int], drawn: list[int]) -> list[int]:
    """The draft nodes kept, root first: from the root, the child whose token the target drew at its
    parent's row (`drawn[0]`: the root's row; `drawn[1 + i]`: node i's), for as long as there is one.
    The token drawn at the last kept row is the bonus token that ends the run.

    Greedy rows draw the argmax, so this walks the target's argmax path: plain decoding's output.
    Sampled rows: for a drafter whose q is one-hot per proposed child (n-gram, jump-forward), the
    multi-branch rule (accept child c with probability min(1, p(c)/q(c)) = p_res(c), else go on with
    the residual norm(max(p_res - q, 0)), which zeroes c, and try the next sibling; at the end sample the
    residual) accepts child c with probability p(c) and otherwise yields token x outside the children
    with probability p(x): exactly one draw x ~ p, kept as a child when it is one. Drawing x with the
    sampler's counter-based uniform also makes a seeded request's tokens the same with or without
    speculation.
    """
    children: dict[tuple[int, int], int] = {}
    for i, (token, p) in enumerate(zip(tokens, parents)):
        children.setdefault((p, token), i)
    path, node = [], -1
    while (child := children.get((node, drawn[node + 1]))) is not None:
        path.append(child)
        node = child
    return path
