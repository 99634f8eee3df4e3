"""Draft tree helpers: item parents, paths, pruning and the acceptance walk, against hand-built trees."""
from __future__ import annotations

from radixlang.runtime.speculative.tree import DraftTree, accept_path, chain, item_parents, paths, prune

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
