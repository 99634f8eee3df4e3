"""The n-gram trie against brute-force counting over the sequence, and its draft trees against the
sequence they must come from."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from radixlang.runtime.speculative.ngram import NgramTrie


def trie_counts(trie: NgramTrie) -> Counter:
    out, stack = Counter(), [((), trie.root)]
    while stack:
        key, node = stack.pop()
        for token, child in node.children.items():
            out[key + (token,)] = child.count
            stack.append((key + (token,), child))
    return out


def brute_counts(seqs: list[list[int]], window: int) -> Counter:
    out = Counter()
    for seq in seqs:
        for i in range(len(seq)):
            for n in range(1, window + 1):
                if i + n <= len(seq):
                    out[tuple(seq[i:i + n])] += 1
    return out


@pytest.mark.parametrize("seed", range(5))
def test_trie_counts_every_ngram_up_to_the_window_fed_in_any_chunks(seed):
    rng = random.Random(seed)
    window = rng.randint(2, 6)
    seqs = [[rng.randrange(4) for _ in range(rng.randint(1, 60))] for _ in range(3)]
    trie = NgramTrie(window)
    for seq in seqs:
        trie.end_sequence()
        i = 0
        while i < len(seq):  # incremental, in random chunks
            j = i + rng.randint(1, 7)
            trie.feed(seq[i:j])
            i = j
    expected = brute_counts(seqs, window)
    assert trie_counts(trie) == expected
    assert trie.size == len(expected)


def occurs(seq: list[int], run: list[int]) -> bool:
    return any(seq[i:i + len(run)] == run for i in range(len(seq) - len(run) + 1))


@pytest.mark.parametrize("seed", range(8))
def test_draft_tree_paths_continue_the_longest_matched_suffix(seed):
    rng = random.Random(seed)
    seq = [rng.randrange(3) for _ in range(80)]
    trie = NgramTrie(10)
    trie.feed(seq)
    budget, max_breadth, max_depth = rng.randint(1, 12), rng.randint(1, 3), rng.randint(1, 5)
    found = trie.match(seq, 1, 4)
    tree = trie.expand(found, budget, max_breadth, max_depth)
    # the oracle: the longest suffix (<= 4 tokens) seen earlier with something after it
    match = next(n for n in range(4, 0, -1) if occurs(seq[:-1], seq[-n:]))
    assert found.length == match
    suffix = seq[-match:]
    assert 0 < len(tree.tokens) <= budget
    paths: list[list[int]] = []
    for token, parent in zip(tree.tokens, tree.parents):
        assert parent < len(paths)
        paths.append((paths[parent] if parent >= 0 else []) + [token])
        assert len(paths[-1]) <= max_depth
        assert occurs(seq, suffix + paths[-1]), "every path continues the suffix somewhere in the sequence"
    for parent in [-1, *range(len(paths))]:
        kids = [tree.tokens[i] for i, p in enumerate(tree.parents) if p == parent]
        assert len(kids) == len(set(kids)) and len(kids) <= max_breadth
    # the first node is the suffix's most frequent continuation
    follow = Counter(seq[i + match] for i in range(len(seq) - match) if seq[i:i + match] == suffix)
    assert follow[tree.tokens[0]] == max(follow.values())


def test_no_draft_without_a_match_or_budget():
    trie = NgramTrie(4)
    trie.feed([1, 2, 3, 4])
    assert trie.match([9, 9], 1, 3) is None
    assert trie.match([1, 2, 3, 4], 1, 3) is None  # seen, but never continued
    found = trie.match([1, 2], 1, 3)
    assert found.length == 2
    assert trie.expand(found, 0, 2, 4).tokens == []
    assert trie.expand(found, 8, 2, 4).tokens == [3, 4]
