"""fsa.py's loops in C (kernels/cpu/fsa.c): the subset construction (the NFA laid out as flat arrays, its
rows and subsets copied back; the same DFA, numbered alike, as the Python path: test_fsa checks it), trim's
backward reach, and minimization's finite classes and partition refinement (each the Python path's partition).

The layout is a few passes over the NFA's lists at C speed (map, chain, np.fromiter), no Python loop per
state or edge. Edges read symbol sequences that many edges share (an alphabet's class members): they are
numbered by object (`id`, as the Python path groups them), so a shared set is laid out once.
"""
from __future__ import annotations

import ctypes
import itertools
import operator
from typing import Protocol, Sequence

import numpy as np

from ....kernels.cpu import fsa as native
from ....kernels.cpu.c_library import address
from .. import deadline


class Nfa(Protocol):
    """What the construction reads of fsa.Nfa (named here, not imported: fsa imports this module)."""

    eps: list[list[int]]
    edges: list[list[tuple[Sequence[int], int]]]
    accepts: dict[int, int]


def available() -> bool:
    return native.library() is not None


def subsets(nfa: Nfa, start: int, num_symbols: int, limit: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(status, rows [S, num_symbols], ptr [S + 1], members): native.OK, or why it stopped (then the arrays are
    empty). Each state's subset is members[ptr[s]:ptr[s + 1]], sorted."""
    lib = native.library()
    assert lib is not None
    eps, edges, n = nfa.eps, nfa.edges, len(nfa.eps)
    eps_ptr = _offsets(eps, n)
    eps_flat = np.fromiter(itertools.chain.from_iterable(eps), np.int32, int(eps_ptr[-1]))
    edge_ptr = _offsets(edges, n)
    num_edges = int(edge_ptr[-1])
    flat = list(itertools.chain.from_iterable(edges))  # (symbols, target) pairs, by state
    keys = np.fromiter(map(id, map(operator.itemgetter(0), flat)), np.uint64, num_edges)
    _, first, edge_set = np.unique(keys, return_index=True, return_inverse=True)
    sets = [flat[i][0] for i in first.tolist()]
    set_ptr = _offsets(sets, len(sets))
    set_symbols = np.fromiter(itertools.chain.from_iterable(sets), np.int32, int(set_ptr[-1]))
    important = (edge_ptr[1:] > edge_ptr[:-1]).astype(np.uint8)
    important[list(nfa.accepts)] = 1
    important[start] = 1
    edge_set = np.ascontiguousarray(edge_set.ravel(), np.int32)
    edge_target = np.fromiter(map(operator.itemgetter(1), flat), np.int32, num_edges)
    for values, bound in ((set_symbols, num_symbols), (eps_flat, n), (edge_target, n)):  # C indexes by them
        if len(values) and not (0 <= int(values.min()) and int(values.max()) < bound):
            raise IndexError(f"an NFA's symbol or state is out of range (0..{bound - 1})")
    when = deadline.at()
    handle = lib.rl_subsets(n, address(eps_ptr), address(eps_flat), address(edge_ptr), address(edge_set),
                            address(edge_target), len(sets), address(set_ptr), address(set_symbols),
                            address(important), start, num_symbols, limit, 0.0 if when is None else when)
    if not handle:
        raise MemoryError("the subset construction could not allocate its tables")
    try:
        shape = np.zeros(3, np.int64)
        lib.rl_subsets_shape(handle, address(shape))
        status, num_states, num_members = shape.tolist()
        if status != native.OK:
            return status, np.zeros((0, num_symbols), np.int64), np.zeros(1, np.int64), np.zeros(0, np.int32)
        rows = np.empty((num_states, num_symbols), np.int64)
        ptr = np.empty(num_states + 1, np.int64)
        members = np.empty(num_members, np.int32)
        lib.rl_subsets_copy(handle, address(rows), address(ptr), address(members))
        return status, rows, ptr, members
    finally:
        lib.rl_subsets_free(ctypes.c_void_p(handle))


def _offsets(lists: list, n: int) -> np.ndarray:
    """CSR offsets of a list of sequences: entries of lists[i] are at [ptr[i], ptr[i + 1])."""
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.fromiter(map(len, lists), np.int64, n), out=ptr[1:])
    return ptr


def live(trans: np.ndarray, accept: np.ndarray) -> np.ndarray | None:
    """The states that reach an accepting one (bool [S]); None out of memory."""
    out = _over_dfa("rl_live", trans, accept, np.uint8)
    return None if out is None else out.view(bool)


def finite_classes(trans: np.ndarray, accept: np.ndarray) -> np.ndarray | None:
    """fsa._finite_classes's partition (not its numbers); None out of memory."""
    return _over_dfa("rl_finite_classes", trans, accept, np.int64)


def refine(trans: np.ndarray, labels: np.ndarray) -> np.ndarray | None:
    """fsa.refine's partition to the end (not its numbers), by Hopcroft's algorithm; None out of memory."""
    return _over_dfa("rl_refine", trans, labels, np.int64)


def _over_dfa(name: str, trans: np.ndarray, labels: np.ndarray, dtype: type) -> np.ndarray | None:
    """One of fsa.c's functions of (n, k, trans, labels, out [n]); None where it ran out of memory."""
    lib = native.library()
    assert lib is not None
    trans, labels = np.ascontiguousarray(trans, np.int64), np.ascontiguousarray(labels, np.int64)
    if trans.size and not (-1 <= int(trans.min()) and int(trans.max()) < len(trans)):  # C indexes by them
        raise IndexError(f"a DFA's move is out of range (-1..{len(trans) - 1})")
    out: np.ndarray = np.empty(len(trans), dtype)
    if getattr(lib, name)(len(trans), trans.shape[1], address(trans), address(labels), address(out)) < 0:
        return None
    return out
