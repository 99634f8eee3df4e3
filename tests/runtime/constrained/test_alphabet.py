"""Code-point classes: a partition of the sets' union, exactly as coarse as the sets and UTF-8 widths allow."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixlang.runtime.constrained.regex import regex_ast as ra
from radixlang.runtime.constrained.regex.alphabet import alphabet_of

EDGES = [0, 0x41, 0x7F, 0x80, 0xE9, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF]
points = st.one_of(st.sampled_from(EDGES), st.integers(0, ra.MAX_CODE_POINT))
sets = st.lists(st.tuples(points, points).map(sorted), min_size=1, max_size=4).map(ra.normalize).filter(bool)


def inside(ranges: ra.Ranges, cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)


@settings(max_examples=200, deadline=None)
@given(st.lists(sets, min_size=1, max_size=5), st.randoms(use_true_random=False))
def test_classes_partition_the_sets_and_split_only_where_membership_or_width_differs(given_sets, rng):
    alphabet = alphabet_of(given_sets)
    for ranges in given_sets:  # each set is exactly the union of its classes
        assert ra.normalize(r for k in alphabet.members[ranges] for r in alphabet.classes[k]) == ranges
    probes = [cp for ranges in alphabet.classes for lo, hi in ranges for cp in (lo, hi, rng.randint(lo, hi))]
    signature = {}
    for k, ranges in enumerate(alphabet.classes):
        for cp in (cp for cp in probes if inside(ranges, cp)):
            sig = (tuple(inside(s, cp) for s in given_sets), len(chr(cp).encode()))
            assert sig[1] == alphabet.widths[k]
            assert signature.setdefault(k, sig) == sig  # one class: same sets, same width
    assert len(set(signature.values())) == len(alphabet.classes)  # coarsest: classes differ


def test_code_points_in_no_set_belong_to_no_class():
    alphabet = alphabet_of([((0x61, 0x7A),), ((0xE9, 0xE9),)])
    covered = ra.normalize(r for ranges in alphabet.classes for r in ranges)
    assert covered == ((0x61, 0x7A), (0xE9, 0xE9))
    assert len(alphabet.classes) == 2


def test_a_class_never_straddles_a_utf8_width():
    alphabet = alphabet_of([((0x70, 0x900),)])
    assert sorted(alphabet.widths.tolist()) == [1, 2, 3]


@settings(max_examples=300, deadline=None)
@given(st.lists(sets, min_size=0, max_size=8))
def test_the_plain_python_path_numbers_the_classes_as_the_vectorised_one(given_sets):
    """Small inputs take _small_alphabet; the vectorised path (large inputs) is its oracle: the same classes, in
    the same order (DFA columns and caches depend on it), the same widths and members."""
    from radixlang.runtime.constrained.regex import alphabet as al

    unique = list(dict.fromkeys(given_sets))
    cuts = sorted({0, ra.MAX_CODE_POINT + 1, *al._WIDTH_CUTS, *(b for s in unique for lo, hi in s for b in (lo, hi + 1))})
    small, wide = al._small_alphabet(unique, cuts), al._numpy_alphabet(unique, cuts)
    assert small.classes == wide.classes
    assert small.widths.tolist() == wide.widths.tolist() and small.widths.dtype == wide.widths.dtype
    assert small.members == wide.members
