"""The vocabulary trie as flat arrays by node number, walked by the native token walk (kernels/cpu/token_walk.c).

Built once per vocabulary (beside VocabTrie, which it flattens). Per DFA, `NativeWalker` holds the automaton's
tables as the C code reads them and walks one state at a time; the masks equal the numpy walk's
(token_index.TokenIndex), which stays the path where no C compiler is found.
"""
from __future__ import annotations

import ctypes
import mmap
import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ....kernels.cpu.c_library import address
from ....kernels.cpu.token_walk import library
from ..regex.automaton import Dfa
from .vocab_trie import VocabTrie
from .vocab_trie import expand_ranges as _expand

LOOP_MIN_BYTES = 32  # a start state looping on fewer bytes walks its loop: skipping saves little there
RUN_MIN_LENGTH = 8  # ... and one whose run (token_walk.c's Runs) is shorter walks it
_UNBUILT_ROOM = 64  # unbuilt states one walk reports (the caller builds them and walks again)
_WITHIN_CACHE = 256  # skip sets (and lengths) whose tokens are kept: a schema's strings share a few, 6 KB each
REGION_MAX_STATES = 48  # a dense state's region (token_walk.c's rl_region): a string's body, with its UTF-8 and escapes
_REGION_CACHE = 256  # regions' tokens kept per vocabulary (6 KB each): every schema's strings share a few shapes
_EVERY_BYTE = np.full(4, ~np.uint64(0))
_NO_ROWS = np.zeros(0, np.int64)
_NO_ROWS.flags.writeable = False  # shared by every result with none
_MAPPED_MIN_BYTES = 1 << 20  # zeroed maps arrays from this size on
# a dense state whose skip set leaves at most this many tokens unsettled walks each of them alone (rl_walk_candidates)
# instead of the trie: a string's body leaves the ~1,300 tokens with a quote, a backslash, a control or a non-ASCII
# byte (SmolLM2), ~20-40 us cold, where the trie walk visits every child of each node on their paths (~100-400 us)
CANDIDATES_MAX = 4096
_SPLITS_KEPT = 256  # dense splits kept per vocabulary (~20 KB each), by skip set and length
SHARED_MAX_STATES = 32  # a state reaching at most this many shares its walk with every state that reads alike
SHARED_WALK_BYTES = 32 << 20  # the shared walks' memory (keys and results) per vocabulary, the oldest dropped past it
# a state's walk as token_index keeps it: its packed bits, and its boundaries' (rows, positions, labels)
StateWalk = tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]
_SIGNATURE_ROOM = 8 + 256 + 256 * 128 + 4 + 4 * 128  # token_walk.c's rl_signature: its most bytes (SIG_MAX)


@dataclass(eq=False)
class NativeTrie:
    """The trie's nodes renumbered in depth-first preorder: a node's subtree is a run of numbers, and the
    tokens ending in it a run of `end_rows` (the walk reads memory in order, and skips a subtree in one step)."""

    lib: ctypes.CDLL
    size: int  # mask length in tokens
    sizes: np.ndarray  # [n] int64: node k's subtree is nodes [k, k + sizes[k])
    byte: np.ndarray  # [n] uint8
    end_start: np.ndarray  # [n + 1] int64: the tokens ending at node k are end_ids[end_start[k]:end_start[k+1]]
    end_ids: np.ndarray  # token ids
    end_rows: np.ndarray  # the same tokens as vocabulary rows
    subtree: np.ndarray  # [n * 4] uint64: the bytes in a node's subtree
    height: np.ndarray  # [n] int32: the longest path down from a node, itself included
    token_node: np.ndarray  # [N] by vocabulary row
    ids: np.ndarray  # [N] token id by row
    row_len: np.ndarray  # [N] token length in bytes by row
    matrix: np.ndarray  # [N, longest] uint8: the tokens' bytes by row (TokenVocab.matrix)
    starting_with: Callable[[np.ndarray], np.ndarray]  # TokenVocab.starting_with: bits of a first-byte set's tokens
    _within: dict[tuple[bytes, int], np.ndarray] = field(default_factory=dict)
    _regions: dict[bytes, np.ndarray] = field(default_factory=dict)  # region_bits'
    _longest: dict[bytes, int] = field(default_factory=dict)  # within's: the longest token of a byte set
    _splits: dict[tuple[bytes, int, bool], tuple[DenseSplit | None]] = field(default_factory=dict)  # dense_split's
    _walks: dict[bytes, tuple[StateWalk, int]] = field(default_factory=dict)  # shared walks by signature, and their bytes
    _walks_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    walk_args: tuple = ()  # rl_walk's first arguments (the trie's arrays), set once
    max_len: int = 0  # the longest token's bytes, set once
    by_byte: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # dense_split's tables, set once
    by_byte_start: np.ndarray = field(default_factory=lambda: np.zeros(257, np.int64))
    longest_first: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    longest_len: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    all_bits: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))  # every token's bit
    _split_args: tuple = ()
    root_child: np.ndarray = field(default_factory=lambda: np.full(256, -1, np.int64))  # by byte: the root's child

    @classmethod
    def create(cls, trie: VocabTrie, ids: np.ndarray, matrix: np.ndarray, size: int,
               starting_with: Callable[[np.ndarray], np.ndarray]) -> "NativeTrie | None":
        """None where the native library is not available. Sorted rows list the tokens in preorder, so
        nodes sorted by (their subtree's first row, depth) are in preorder."""
        lib = library()
        if lib is None:
            return None
        levels = trie.levels
        n = trie.num_nodes
        depth = np.concatenate([np.full(len(level.byte), d) for d, level in enumerate(levels)])
        row_start = np.concatenate([level.row_start for level in levels])
        row_end = np.concatenate([level.row_end for level in levels])
        parent = np.concatenate([np.full(len(levels[0].byte), -1)]
                                + [level.parent + above.offset for above, level in zip(levels, levels[1:])])
        order = np.lexsort((depth, row_start))
        number = np.empty(n, np.int64)
        number[order] = np.arange(n)
        sizes = np.searchsorted(row_start[order], row_end[order], side="left") - np.arange(n)
        byte = np.concatenate([level.byte for level in levels])[order].astype(np.uint8)
        parent = np.where(parent[order] >= 0, number[np.maximum(parent[order], 0)], -1).astype(np.int64)
        token_node = number[trie.token_node]
        rows = np.argsort(token_node, kind="stable")
        end_start = np.searchsorted(token_node[rows], np.arange(n + 1)).astype(np.int64)
        path = np.zeros(n * 4, np.uint64)  # the bytes on each node's path: not kept (dense_split's lists hold them)
        subtree = np.zeros(n * 4, np.uint64)
        height = np.zeros(n, np.int32)
        lib.rl_trie_bytes(n, address(parent), address(byte), address(path), address(subtree), address(height))
        return cls(lib, size, sizes.astype(np.int64), byte, end_start, np.ascontiguousarray(ids[rows], np.int64),
                   rows.astype(np.int64), subtree, height, token_node.astype(np.int64),
                   np.ascontiguousarray(ids, np.int64), (depth[trie.token_node] + 1).astype(np.int64),
                   np.ascontiguousarray(matrix, np.uint8), starting_with)

    def subtree_rows(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The vocabulary rows of the tokens in each node's subtree, concatenated, and their count per node."""
        starts = self.end_start[nodes]
        counts = self.end_start[nodes + self.sizes[nodes]] - starts
        return self.end_rows[_expand(starts, counts)], counts

    def __post_init__(self) -> None:
        self.max_len = int(self.row_len.max(initial=0))
        node = 0  # the root's children: each one's subtree runs to the next
        while node < len(self.byte):
            self.root_child[self.byte[node]] = node
            node += int(self.sizes[node])
        self._index_bytes()

    def _index_bytes(self) -> None:
        """dense_split's tables (token_walk.c's rl_dense_split), tokens numbered in preorder: for each byte the
        tokens holding it, the tokens longest first, and the bits of every token."""
        n, width = len(self.end_rows), self.matrix.shape[1]
        lengths = self.row_len[self.end_rows]
        held = self.matrix[self.end_rows] if n else np.zeros((0, width), np.uint8)
        inside = np.arange(width) < lengths[:, None]
        holds = np.zeros((256, n), bool)  # by byte, then token: its nonzero entries come out in that order, once each
        holds[held[inside], np.nonzero(inside)[0]] = True
        by, token = np.nonzero(holds)
        self.by_byte = token.astype(np.int32)
        self.by_byte_start = np.searchsorted(by, np.arange(257)).astype(np.int64)
        order = np.argsort(-lengths, kind="stable")
        self.longest_first, self.longest_len = order.astype(np.int32), np.ascontiguousarray(lengths[order], np.int64)
        self.all_bits = np.zeros(-(-self.size // 8), np.uint8)
        np.bitwise_or.at(self.all_bits, self.ids >> 3, (1 << (self.ids & 7)).astype(np.uint8))
        self._split_args = (address(self.by_byte_start), address(self.by_byte), address(self.longest_first),
                            address(self.longest_len), n, address(self.end_rows), address(self.row_len),
                            address(self.matrix), width, address(self.ids), address(self.all_bits),
                            len(self.all_bits))
        self.walk_args = (len(self.byte), *(address(a) for a in (
            self.sizes, self.byte, self.height, self.end_start, self.end_ids, self.subtree)))

    def within(self, loop: np.ndarray, max_len: int) -> np.ndarray:
        """Packed bits of the tokens no longer than `max_len` made only of the bytes in `loop` (a 256-bit set as
        4 uint64); shared. A length past the longest such token is that token's: a bounded string's states, each
        with its own run length, share one entry until the last few characters."""
        set_key = loop.tobytes()
        longest = self._longest.get(set_key)
        if longest is not None:
            n = min(max_len, longest)
            hit = self._within.get((set_key, self.max_len if n == longest else n))
            if hit is not None:
                return hit
        bits = np.zeros(-(-self.size // 8), np.uint8)
        seen, seen_at = _SCRATCH.get("seen", -(-len(self.end_rows) // 64), np.uint64)
        longest = self.lib.rl_tokens_within(address(self.by_byte_start), address(self.by_byte), len(self.end_rows),
                                            address(self.end_rows), address(self.row_len), address(self.ids),
                                            address(loop), max_len, seen_at, address(bits))
        n = min(max_len, longest)
        with self._lock:
            if len(self._longest) >= _WITHIN_CACHE:
                self._longest.clear()
            self._longest[set_key] = longest
        self._keep(self._within, (set_key, self.max_len if n == longest else n), bits, _WITHIN_CACHE)
        return bits

    def dense_split(self, skip: np.ndarray, skip_len: int, dead_tail: bool = False) -> DenseSplit | None:
        """A dense state's tokens split by its skip set (`skip`, of `skip_len` bytes; rl_skip_set): those it settles,
        and the others to walk one by one; None where those are more than CANDIDATES_MAX. With `dead_tail` (a run
        whose end reads none of its bytes) the tokens of its bytes longer than `skip_len` are settled too, as not
        read: the last characters of a bounded string walk only the tokens holding a quote or an escape. Kept by
        the set, its length and the tail; shared, read-only."""
        n = min(skip_len, self.max_len)
        key = (skip.tobytes(), n, dead_tail)
        hit = self._splits.get(key)  # one read: another thread may drop the entry meanwhile
        if hit is not None:
            return hit[0]
        size = 3 * CANDIDATES_MAX + 1  # rows, ids, then 0 and the end offsets
        out, out_at = _SCRATCH.get("candidates", size, np.int64)
        data, data_at = _SCRATCH.get("candidate_bytes", CANDIDATES_MAX * self.max_len, np.uint8)
        seen, seen_at = _SCRATCH.get("seen", -(-len(self.end_rows) // 64), np.uint64)
        settled = np.empty(len(self.all_bits), np.uint8)
        out[2 * CANDIDATES_MAX] = 0
        count = self.lib.rl_dense_split(*self._split_args, address(skip), n, dead_tail, CANDIDATES_MAX, seen_at, out_at,
                                        out_at + 8 * CANDIDATES_MAX, out_at + 8 * (2 * CANDIDATES_MAX + 1), data_at,
                                        address(settled))
        found = None
        if count <= CANDIDATES_MAX:
            ends = out[2 * CANDIDATES_MAX:2 * CANDIDATES_MAX + count + 1].copy()
            found = DenseSplit(settled, out[:count].copy(), out[CANDIDATES_MAX:CANDIDATES_MAX + count].copy(), ends,
                               data[:ends[-1]].copy())
            for a in (found.settled, found.rows, found.ids, found.offsets, found.data):
                a.flags.writeable = False
        with self._lock:
            if len(self._splits) >= _SPLITS_KEPT:
                self._splits.pop(next(iter(self._splits)))
            self._splits[key] = (found,)
        return found

    def region_bits(self, table: np.ndarray, entry: np.ndarray | None = None) -> np.ndarray:
        """Packed bits of the tokens read from a region's first member without leaving it (`table`: token_walk.c's
        rl_region rows, 256 region numbers per member, -1: dead or leaving); shared. Kept by the table, so every DFA
        with a region of that shape (a JSON string's body, in any schema) walks it once per vocabulary. With
        `entry` (a 256-bit set as 4 uint64): the tokens whose first byte is in it and whose other bytes are read
        from the first member without leaving."""
        key = table.tobytes() if entry is None else table.tobytes() + entry.tobytes()
        hit = self._regions.get(key)
        if hit is None:
            if entry is _EVERY_BYTE:
                rows = table.reshape(-1, 256)
                shifted = np.where(rows >= 0, rows + 1, -1)
                hit = self._region_walk(np.concatenate([np.ones((1, 256), rows.dtype), shifted]))
            elif entry is None:
                hit = self._region_walk(table.reshape(-1, 256))
            else:  # a first state whose every byte leads to the first member: its tokens, then those of `entry`
                first = np.unpackbits(entry.view(np.uint8), bitorder="little").view(bool)
                hit = self.region_bits(table, _EVERY_BYTE) & self.starting_with(first)
            self._keep(self._regions, key, hit, _REGION_CACHE)
        return hit

    def shared_walk(self, signature: bytes) -> StateWalk | None:
        """The walk kept under `signature` (NativeWalker.signature), or None."""
        hit = self._walks.get(signature)
        return None if hit is None else hit[0]

    def keep_walk(self, signature: bytes, walk: StateWalk, size: int) -> None:
        """Keeps `walk` (read-only arrays, `size` bytes of them) under `signature`; the oldest walks are dropped
        while the kept ones take more than SHARED_WALK_BYTES."""
        size += len(signature)
        if size > SHARED_WALK_BYTES // 16:
            return
        with self._lock:
            if signature in self._walks:
                return
            while self._walks and self._walks_bytes + size > SHARED_WALK_BYTES:
                self._walks_bytes -= self._walks.pop(next(iter(self._walks)))[1]
            self._walks[signature] = (walk, size)
            self._walks_bytes += size

    def _keep(self, cache: dict, key: bytes | tuple, bits: np.ndarray, limit: int) -> None:
        """`bits` kept read-only in `cache` under `key`, the oldest entry dropped past `limit`."""
        bits.flags.writeable = False
        with self._lock:
            if len(cache) >= limit:
                cache.pop(next(iter(cache)))
            cache[key] = bits

    def _region_walk(self, rows: np.ndarray) -> np.ndarray:
        trans = rows.astype(np.int32)
        walker = NativeWalker(self, Dfa(trans, np.full(len(trans), -1, np.int32)), None, regions=False)
        return walker.walk(0, False).bits


@dataclass(frozen=True, eq=False)
class DenseSplit:
    """A dense state's tokens by its skip set (NativeTrie.dense_split): the bits of those it settles, and the others
    (its candidates): their rows, ids, and bytes packed together (candidate k's are data[offsets[k]:offsets[k + 1]]),
    so a walk reads them in order, where the vocabulary's rows lie far apart."""

    settled: np.ndarray
    rows: np.ndarray
    ids: np.ndarray
    offsets: np.ndarray
    data: np.ndarray


@dataclass(slots=True)
class NativeResult:
    bits: np.ndarray  # packed little-endian mask bits
    bound_rows: np.ndarray  # vocabulary rows of the tokens that died after a complete lexeme (with boundaries)
    bound_pos: np.ndarray
    bound_labels: np.ndarray
    unbuilt: np.ndarray  # unbuilt states reached (the walk is then void)


class NativeWalker:
    """One DFA's tables as token_walk.c reads them, and each state's loop set (found on first use)."""

    def __init__(self, trie: NativeTrie, dfa: Dfa, unbuilt: np.ndarray | None, regions: bool = True,
                 grown_from: "NativeWalker | None" = None, dense: bool = True):
        """`regions`: whether dense states' walks use their region's kept tokens (`_region`); `dense`: whether they
        walk their candidates alone where few (`_walk_candidates`; with neither, a dense state walks the trie).
        `grown_from`: the walker of this DFA before it grew (rows added, unbuilt ones built): its loops and runs,
        found on built rows only, stay true and are kept (a lazily built table grows often; new zeroed arrays cost
        more than the walks between)."""
        self.trie, self.regions, self.dense = trie, regions, dense
        self.trans = np.ascontiguousarray(dfa.trans, np.int32)
        self.width = int(dfa.trans.shape[1])
        self.byte_class = np.ascontiguousarray(dfa.byte_class, np.int32)
        self.accept = np.ascontiguousarray(dfa.accept, np.int32)
        self.unbuilt = None if unbuilt is None else np.ascontiguousarray(unbuilt).view(np.uint8)  # marks may clear
        n = len(self.trans)
        old: tuple[np.ndarray, ...] | None = grown_from.caches if grown_from is not None else None
        if old is None or len(old[1]) < n:
            room = 2 * n if unbuilt is not None else n  # a lazily built table grows: room to keep its caches
            # each state's loop set and whether it is known, then its run (token_walk.c's Runs): its bytes,
            # length, successor, and whether they are known yet
            caches = (zeroed(room * 4, np.uint64), zeroed(room, np.uint8), zeroed(room * 4, np.uint64),
                      zeroed(room, np.int32), zeroed(room, np.int32), zeroed(room, np.uint8))
            if old is not None:
                for k in (1, 5, 0, 2, 3, 4):  # the known marks first: a walk in another thread may add one,
                    caches[k][:len(old[k])] = old[k]  # whose words are written before its mark
            old = caches
        self.caches: tuple[np.ndarray, ...] = old
        self.loops, self.known = old[0], old[1]
        self.runs = old[2:]
        self._bounds = 1024  # boundary room; grows when a walk finds more
        self._big: np.ndarray | None = None  # signature's marks (found on first use)
        self._big_at = 0
        self._tables = (address(self.trans), self.width, address(self.byte_class))
        self._loop_sets = (address(self.loops), address(self.known))
        # rl_walk_args's fixed arguments (token_walk.c's WalkArgs), addresses as int64 (null: 0)
        self._args = np.array([a or 0 for a in (*trie.walk_args, *self._tables, address(self.accept), *self._loop_sets,
                                                *(address(a) for a in self.runs), address(self.unbuilt),
                                                address(trie.root_child))], np.int64)
        self._args_at = address(self._args)

    def walk_rows(self, matrix: np.ndarray, lengths: np.ndarray, rows: np.ndarray, start: int,
                  offset: int | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(end state or -1, stop position, stop state) of each row's bytes from its `offset` (one for all, or
        one per row), walked from `start`."""
        rows = np.ascontiguousarray(rows, np.int64)
        offsets = np.ascontiguousarray(np.broadcast_to(np.asarray(offset, np.int64), rows.shape))
        out = np.empty((3, len(rows)), np.int64)
        at = out.ctypes.data
        self.trie.lib.rl_walk_rows(len(rows), address(rows), address(matrix), matrix.shape[1], address(lengths),
                                   *self._tables, start, address(offsets), at, at + 8 * len(rows), at + 16 * len(rows))
        return out[0], out[1], out[2]

    def signature(self, state: int, labels: bool) -> bytes | None:
        """What a walk from `state` reads, canonically (token_walk.c's rl_signature; with `labels`, the accepted
        labels too: a walk recording boundaries reads them): states of any DFA with the same signature walk alike.
        None where `state` reaches more than SHARED_MAX_STATES states."""
        _, out_at = _SCRATCH.get("signature", _SIGNATURE_ROOM, np.uint8)
        if self._big is None:  # rl_signature's marks of states that reach too many
            self._big = np.zeros(len(self.trans), np.uint8)
            self._big_at = self._big.ctypes.data
        n = self.trie.lib.rl_signature(self._args_at, state, SHARED_MAX_STATES, labels, self._big_at, out_at)
        return ctypes.string_at(out_at, n) if n else None

    def _skip_set(self, state: int, boundaries: bool) -> tuple[np.ndarray | None, int, bool]:
        """The bytes (and how many in a row) that read alive from `state` whatever their order, where there are
        enough for skipping to pay: its loop (a string's body), else its run (a bounded string's; in a lazily
        built DFA it ends before an unbuilt row, which must not be read); and whether the run's tail is dead (the
        state after it reads none of its bytes: token_walk.c's rl_skip_set). The set is this thread's scratch,
        valid until its next walk."""
        t = self.trie
        out, out_at = _SCRATCH.get("skip", 6, np.uint64)  # the set's 4 words, its length, whether its tail is dead
        if not t.lib.rl_skip_set(self._args_at, state, LOOP_MIN_BYTES, RUN_MIN_LENGTH, t.max_len, boundaries, out_at):
            return None, 0, False
        return out[:4], int(out[4]), bool(out[5])

    def _region(self, state: int, boundaries: bool) -> tuple[np.ndarray, int, int] | None:
        """For a dense state: the tokens read without leaving its region (token_walk.c's rl_region: a string's
        body), found once per region's shape and vocabulary, and the address of the bytes that never leave it
        (this thread's scratch, valid until its next walk), for the walk to skip the subtrees made of them."""
        table, table_at = _SCRATCH.get("region", REGION_MAX_STATES * 256, np.int16)
        stay, stay_at = _SCRATCH.get("stay", 9, np.uint64)  # exit bytes, then the entry bytes and whether there are
        n = self.trie.lib.rl_region(self._args_at, state, LOOP_MIN_BYTES, REGION_MAX_STATES, boundaries, table_at,
                                    stay_at, stay_at + 32)
        if not n:
            return None
        bits = self.trie.region_bits(table[:n * 256], stay[4:8] if stay[8] else None)
        np.invert(stay[:4], out=stay[:4])  # the exit bytes, as the bytes that stay
        return bits, stay_at, stay_at + 32 if stay[8] else 0

    def walk(self, state: int, boundaries: bool) -> NativeResult:
        t = self.trie
        n_bytes = -(-t.size // 8)
        work, bits_at = _SCRATCH.get("bits", n_bytes, np.uint8)
        plain = self._walk_trie(state, boundaries, lambda bounds_cap, scratch_at: t.lib.rl_walk_plain(
            self._args_at, state, LOOP_MIN_BYTES, RUN_MIN_LENGTH, t.max_len, self.regions, boundaries, bits_at, n_bytes,
            bounds_cap, scratch_at, _UNBUILT_ROOM), work[:n_bytes])
        if plain is not None:  # most states: no skip set, no region (one C call; the path below makes three)
            return plain
        loop, loop_len, dead_tail = self._skip_set(state, boundaries)
        if loop is not None:
            split = t.dense_split(loop, loop_len, dead_tail) if self.dense else None
            if split is not None:  # a dense state: its unsettled tokens walked alone, where few
                return self._walk_candidates(state, split, boundaries)
            loop = loop.copy()  # out of this thread's scratch: the region's search below may walk
        region = self._region(state, boundaries) if self.regions else None  # before the scratch bits: it may walk
        work, bits_at = _SCRATCH.get("bits", n_bytes, np.uint8)
        bits = work[:n_bytes]
        loop_at = entry_at = 0  # null: no skipping
        if region is not None:
            bits[:] = region[0]
            loop_at, entry_at, loop_len = region[1], region[2], t.max_len
        elif loop is not None:
            bits[:] = t.within(loop, loop_len)
            loop_at = loop.ctypes.data  # the copy: contiguous
        else:
            bits.fill(0)
        walked = self._walk_trie(state, boundaries, lambda bounds_cap, scratch_at: t.lib.rl_walk_args(
            self._args_at, state, loop_at, entry_at, loop_len, bits_at, bounds_cap, scratch_at, _UNBUILT_ROOM), bits)
        assert walked is not None
        return walked

    def _walk_trie(self, state: int, boundaries: bool, call: Callable[[int, int], int],
                   bits: np.ndarray) -> NativeResult | None:
        """The result of a trie walk into `bits` by `call(bounds_cap, scratch address)` (rl_walk_args or
        rl_walk_plain), called again with more room where it found more boundaries than it had room for (the bits
        come out the same); None where rl_walk_plain declined (-2)."""
        while True:
            cap = self._bounds if boundaries else 0
            # boundaries (3 runs of cap), unbuilt states reached, their count
            scratch, scratch_at = _SCRATCH.get("walk", 3 * cap + _UNBUILT_ROOM + 1, np.int64)
            found = call(cap if boundaries else -1, scratch_at)
            if found == -2:
                return None
            if found < 0:
                raise RecursionError("the vocabulary trie is deeper than the native walk's stack")
            if found <= cap:
                break
            self._bounds = int(found)
        if not found:
            return self._result(bits, _NO_ROWS, _NO_ROWS, _NO_ROWS, scratch, cap)
        rows, counts = self.trie.subtree_rows(scratch[:found])
        return self._result(bits, rows, np.repeat(scratch[cap:cap + found], counts),
                            np.repeat(scratch[2 * cap:2 * cap + found], counts), scratch, cap)

    def _walk_candidates(self, state: int, todo: DenseSplit, boundaries: bool) -> NativeResult:
        """`walk` of a dense state: the tokens its skip set settles, and each of the others walked alone
        (token_walk.c's rl_walk_candidates)."""
        t = self.trie
        work, bits_at = _SCRATCH.get("bits", len(todo.settled), np.uint8)
        bits = work[:len(todo.settled)]
        bits[:] = todo.settled
        while True:
            cap = self._bounds if boundaries else 0
            scratch, scratch_at = _SCRATCH.get("walk", 3 * cap + _UNBUILT_ROOM + 1, np.int64)
            found = t.lib.rl_walk_candidates(self._args_at, state, len(todo.rows), address(todo.offsets),
                                             address(todo.data), address(todo.ids), bits_at,
                                             cap if boundaries else -1, scratch_at, _UNBUILT_ROOM)
            if found <= cap:
                break
            self._bounds = int(found)
        return self._result(bits, todo.rows[scratch[:found]], scratch[cap:cap + found].copy(),
                            scratch[2 * cap:2 * cap + found].copy(), scratch, cap)

    @staticmethod
    def _result(bits: np.ndarray, rows: np.ndarray, pos: np.ndarray, labels: np.ndarray, scratch: np.ndarray,
                cap: int) -> NativeResult:
        """The walk's result, copied out of this thread's scratch (`scratch`'s unbuilt states after 3 runs of `cap`)."""
        reached = int(scratch[3 * cap + _UNBUILT_ROOM])
        if not reached:
            return NativeResult(bits.copy(), rows, pos, labels, _NO_ROWS)
        return NativeResult(bits.copy(), rows, pos, labels, np.unique(scratch[3 * cap: 3 * cap + min(reached, _UNBUILT_ROOM)]))


def zeroed(size: int, dtype: type) -> np.ndarray:
    """np.zeros(size, dtype); a large one from an anonymous map, backed only where written (no swap reserved for the
    rest, where the platform says so), its pages zero when first touched: a lazily built table (object_dispatch) and
    its walker's caches reserve room for the whole table, of which a decode touches a few pages, and np.zeros
    cleared them all (0.5-8 ms per table for the caches alone)."""
    nbytes = size * np.dtype(dtype).itemsize
    if nbytes < _MAPPED_MIN_BYTES:
        return np.zeros(size, dtype)
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0) | getattr(mmap, "MAP_NORESERVE", 0)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags) if flags else mmap.mmap(-1, nbytes), dtype)


class _Scratch(threading.local):
    """Each thread's buffers for the walks to write into, with their addresses found once: an array's address
    (`.ctypes.data`) costs about as much as a small walk's whole C part. A walk copies out what it keeps."""

    def __init__(self) -> None:
        self.arrays: dict[str, tuple[np.ndarray, int]] = {}

    def get(self, name: str, size: int, dtype: type) -> tuple[np.ndarray, int]:
        hit = self.arrays.get(name)
        if hit is None or len(hit[0]) < size:
            array: np.ndarray = np.zeros(size, dtype)
            hit = self.arrays[name] = (array, array.ctypes.data)
        return hit


_SCRATCH = _Scratch()
