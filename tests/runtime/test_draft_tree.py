"""Draft tree helpers: item parents, paths, pruning and the acceptance walk, against hand-built trees."""
from __future__ import annotations

from radixlang.runtime.draft_tree import (
    DraftTree,
    accept_path,
    best_nodes,
    chain,
    item_parents,
    paths,
    prune,
    subtree,
    with_ancestors,
)

# root -> 10 (0) -> 11 (2) -> 12 (4)
#      -> 20 (1) -> 21 (3)
TOKENS, PARENTS = [10, 20, 11, 21, 12], [-1, -1, 0, 1, 2]


def test_a_draft_hangs_from_the_last_verified_token_of_its_item():
    assert item_parents(1 + 5, PARENTS) == [-1, 0, 0, 1, 2, 3]
    assert item_parents(3, chain(1)) == [-1, 0, 1]  # two chained tokens, then a one-node draft


def test_paths_follow_parents():
    assert paths(TOKENS, PARENTS) == [(), (10,), (20,), (10, 11), (20, 21), (10, 11, 12)]


def test_acceptance_walks_the_draws_from_the_root():
    # rows: root, then nodes 0..4; a row's draw picks the child to follow
    assert accept_path(TOKENS, PARENTS, [20, 0, 21, 0, 7, 0]) == [1, 3]  # 20, 21, then bonus 7 from node 3
    assert accept_path(TOKENS, PARENTS, [10, 11, 0, 12, 0, 5]) == [0, 2, 4]  # the whole branch, bonus 5
    assert accept_path(TOKENS, PARENTS, [11, 0, 0, 0, 0, 0]) == []  # 11 is not a child of the root
    assert accept_path([], [], [4]) == []


def test_pruning_drops_subtrees():
    pruned = prune(DraftTree(TOKENS, PARENTS), lambda i, parent: TOKENS[i] != 11)
    assert pruned == DraftTree([10, 20, 21], [-1, -1, 1])


def test_the_best_nodes_by_cumulative_score_form_a_tree():
    import random

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 30)
        parents = [rng.randint(-1, i - 1) for i in range(n)]
        scores: list[float] = []
        for p in parents:  # cumulative log-probabilities: a child never beats its parent
            scores.append((0.0 if p < 0 else scores[p]) + rng.choice([0.0, -rng.random()]))
        budget = rng.randint(1, n)
        kept = best_nodes(scores, budget)
        assert len(kept) == budget and kept == sorted(kept)
        assert all(parents[i] < 0 or parents[i] in kept for i in kept), "closed under parents"
        assert min(scores[i] for i in kept) >= max([scores[i] for i in range(n) if i not in kept], default=-1e9)
        assert with_ancestors(parents, kept) == kept
        tree = subtree(list(range(100, 100 + n)), parents, kept)
        assert paths(tree.tokens, tree.parents)[1:] == [
            tuple(100 + a for a in reversed(_ancestry(parents, i))) for i in kept]


def _ancestry(parents: list[int], i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out
