/* The vocabulary trie walked by a byte DFA: which tokens a DFA state can read (token_walk.py loads this).

The trie's nodes are numbered in depth-first preorder (native_trie.py lays them out), so a node's subtree is
a run of node numbers and the walk reads its arrays in order. A walk descends only below live nodes (the DFA
is trimmed: live means completable), so it costs the live prefixes, not the vocabulary.

Dense states (inside a string) keep most of the vocabulary alive. Where the start state loops on a byte set
B (reading any byte of B leaves it where it was), the caller passes B and the bits of the tokens made only of
B's bytes (every one readable from such a state); the walk then skips, on the path that has stayed in the
loop, every subtree whose bytes all lie in B: what is left is the few tokens with a quote or a non-ASCII byte.
*/
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 1024

/* Per node: the bytes on its path from the root (`path`) and the bytes anywhere in its subtree, itself
   included (`subtree`), as 256-bit sets (4 words each), and the longest path down from it, itself included
   (`height`). `parent` is -1 for the root's children. */
void rl_trie_bytes(int64_t n_nodes, const int64_t *parent, const uint8_t *byte, uint64_t *path, uint64_t *subtree,
                   int32_t *height) {
    memset(path, 0, (size_t)n_nodes * 32);
    memset(subtree, 0, (size_t)n_nodes * 32);
    for (int64_t n = 0; n < n_nodes; n++) { /* parents come first */
        uint64_t *p = path + 4 * n;
        if (parent[n] >= 0) memcpy(p, path + 4 * parent[n], 32);
        p[byte[n] >> 6] |= 1ull << (byte[n] & 63);
        subtree[4 * n + (byte[n] >> 6)] |= 1ull << (byte[n] & 63);
    }
    for (int64_t n = 0; n < n_nodes; n++) height[n] = 1;
    for (int64_t n = n_nodes - 1; n >= 0; n--) { /* children come last */
        if (parent[n] < 0) continue;
        uint64_t *s = subtree + 4 * parent[n];
        for (int w = 0; w < 4; w++) s[w] |= subtree[4 * n + w];
        if (height[n] + 1 > height[parent[n]]) height[parent[n]] = height[n] + 1;
    }
}

/* Marks token t in the bitmap `seen`; returns whether it was not marked before. */
static inline int mark(uint64_t *seen, int32_t t) {
    uint64_t bit = 1ull << (t & 63);
    if (seen[t >> 6] & bit) return 0;
    seen[t >> 6] |= bit;
    return 1;
}

/* Marks in `seen` the tokens holding a byte outside `set`, from the per-byte lists (`by_byte`, tokens in preorder:
   by_byte[by_byte_start[b] .. by_byte_start[b + 1]] hold byte b), stopping once more than `cap` are marked;
   returns how many it marked. */
static int64_t mark_outside(const int64_t *by_byte_start, const int32_t *by_byte, const uint64_t *set, uint64_t *seen,
                            int64_t cap) {
    int64_t found = 0;
    for (int b = 0; b < 256 && found <= cap; b++) {
        if (set[b >> 6] >> (b & 63) & 1) continue;
        for (int64_t k = by_byte_start[b]; k < by_byte_start[b + 1] && found <= cap; k++)
            found += mark(seen, by_byte[k]);
    }
    return found;
}

/* Sets the bit of every token no longer than `max_len` whose bytes all lie in `set`, and returns the longest such
   token's length (whatever `max_len`). The tokens holding a byte outside the set are marked from the per-byte
   lists (rl_dense_split's tables, tokens in preorder) in `seen` (zero on entry and on return), then the others
   are read in one pass. */
int64_t rl_tokens_within(const int64_t *by_byte_start, const int32_t *by_byte, int64_t n_tokens, const int64_t *rows,
                         const int64_t *row_len, const int64_t *ids, const uint64_t *set, int64_t max_len,
                         uint64_t *seen, uint8_t *out_bits) {
    mark_outside(by_byte_start, by_byte, set, seen, INT64_MAX);
    int64_t longest = 0;
    for (int64_t t = 0; t < n_tokens; t++) {
        if (seen[t >> 6] >> (t & 63) & 1) continue;
        int64_t r = rows[t], len = row_len[r];
        if (len > longest) longest = len;
        if (len <= max_len) out_bits[ids[r] >> 3] |= (uint8_t)(1u << (ids[r] & 7));
    }
    memset(seen, 0, (size_t)((n_tokens + 63) / 64) * 8);
    return longest;
}

/* The bytes that lead from state q back to q, as a 256-bit set: computed on first use and kept in `loops`
   (4 words per state), `known[q]` set once they are there (walks of one DFA may run in several threads:
   the words are written before the mark is released, and read after it is acquired). */
static const uint64_t *state_loops(int32_t q, const int32_t *trans, int64_t width, const int32_t *byte_class,
                                   uint64_t *loops, uint8_t *known) {
    uint64_t *out = loops + 4 * (int64_t)q;
    if (!__atomic_load_n(known + q, __ATOMIC_ACQUIRE)) {
        uint64_t w[4] = {0, 0, 0, 0};
        const int32_t *row = trans + (int64_t)q * width;
        for (int b = 0; b < 256; b++)
            if (row[byte_class[b]] == q) w[b >> 6] |= 1ull << (b & 63);
        for (int k = 0; k < 4; k++) __atomic_store_n(out + k, w[k], __ATOMIC_RELAXED);
        __atomic_store_n(known + q, 1, __ATOMIC_RELEASE);
    }
    return out;
}

/* The start state's loop set (see state_loops), and how many bytes it holds. */
int64_t rl_start_loops(int32_t q, const int32_t *trans, int64_t width, const int32_t *byte_class, uint64_t *loops,
                       uint8_t *known) {
    const uint64_t *w = state_loops(q, trans, width, byte_class, loops, known);
    return __builtin_popcountll(w[0]) + __builtin_popcountll(w[1]) + __builtin_popcountll(w[2]) +
           __builtin_popcountll(w[3]);
}

#define RUN_CAP 1024 /* longer than any token */

/* A state's run: the bytes that all lead to its most common successor (`set`, 256 bits), and how many
   such bytes in a row every path reads alive (`len`): the successor's own run has the same bytes, and
   so on. Inside a string of at most n characters, the state after k of them has a run of its
   characters n - k long; a loop's run never ends (RUN_CAP). A subtree of those bytes no taller than
   the run is readable whole. Found on first use, per state, like state_loops. */
typedef struct {
    uint64_t *set;    /* [states * 4] */
    int32_t *len;     /* [states] */
    int32_t *next;    /* [states]: the most common successor (-1: none) */
    uint8_t *known;   /* [states]: 1 set and next known, 2 len known too */
    const uint8_t *unbuilt; /* a lazily built table's unbuilt rows (null: none): a run ends before one */
} Runs;

static void run_set(int32_t q, const int32_t *trans, int64_t width, const int32_t *byte_class, Runs *r) {
    if (__atomic_load_n(r->known + q, __ATOMIC_ACQUIRE)) return;
    int32_t count[256], target[256];
    int n_targets = 0, best = -1;
    const int32_t *row = trans + (int64_t)q * width;
    for (int b = 0; b < 256; b++) {
        int32_t t = row[byte_class[b]];
        if (t < 0) continue;
        int k = 0;
        while (k < n_targets && target[k] != t) k++;
        if (k == n_targets) {
            target[n_targets] = t;
            count[n_targets++] = 0;
        }
        if (++count[k] > (best < 0 ? 0 : count[best])) best = k;
    }
    uint64_t w[4] = {0, 0, 0, 0};
    int32_t next = best < 0 ? -1 : target[best];
    for (int b = 0; b < 256 && next >= 0; b++)
        if (row[byte_class[b]] == next) w[b >> 6] |= 1ull << (b & 63);
    for (int k = 0; k < 4; k++) __atomic_store_n(r->set + 4 * (int64_t)q + k, w[k], __ATOMIC_RELAXED);
    __atomic_store_n(r->next + q, next, __ATOMIC_RELAXED);
    __atomic_store_n(r->known + q, 1, __ATOMIC_RELEASE);
}

static int32_t run_len(int32_t q, const int32_t *trans, int64_t width, const int32_t *byte_class, Runs *r) {
    if (__atomic_load_n(r->known + q, __ATOMIC_ACQUIRE) == 2) return r->len[q];
    run_set(q, trans, width, byte_class, r);
    const uint64_t *set = r->set + 4 * (int64_t)q;
    int32_t len = 0, s = q;
    int cut = 0;
    while (len < RUN_CAP && r->next[s] >= 0) {
        int32_t t = r->next[s];
        if (r->unbuilt && r->unbuilt[t]) { /* its row is a placeholder: the run is cut short (still true), and */
            cut = 1;                       /* not kept: once the row is built it goes on */
            break;
        }
        len++;
        if (t == s) {
            len = RUN_CAP;
            break;
        }
        run_set(t, trans, width, byte_class, r);
        const uint64_t *own = r->set + 4 * (int64_t)t;
        if (own[0] != set[0] || own[1] != set[1] || own[2] != set[2] || own[3] != set[3]) break;
        s = t;
    }
    if (cut) return len;
    __atomic_store_n(r->len + q, len, __ATOMIC_RELAXED);
    __atomic_store_n(r->known + q, 2, __ATOMIC_RELEASE);
    return len;
}

/* The start state's run (see Runs): its bytes in `out_set` (4 words), its length in `*out_len`; returns
   how many bytes the set holds. */
int64_t rl_start_run(int32_t q, const int32_t *trans, int64_t width, const int32_t *byte_class, uint64_t *run_sets,
                     int32_t *run_lens, int32_t *run_next, uint8_t *run_known, const uint8_t *unbuilt, uint64_t *out_set,
                     int64_t *out_len) {
    Runs runs = {run_sets, run_lens, run_next, run_known, unbuilt};
    *out_len = run_len(q, trans, width, byte_class, &runs);
    const uint64_t *w = run_sets + 4 * (int64_t)q;
    for (int k = 0; k < 4; k++) out_set[k] = w[k];
    return __builtin_popcountll(w[0]) + __builtin_popcountll(w[1]) + __builtin_popcountll(w[2]) +
           __builtin_popcountll(w[3]);
}

typedef struct {
    int64_t end;      /* the node number just past the subtree whose children this frame visits */
    int32_t state;    /* the DFA state after the path to that subtree's root */
    int32_t in_loop;  /* the path so far read only bytes of the skip set (`loop`) */
} Frame;

static inline int within(const uint64_t *set, const uint64_t *of) {
    return !(set[0] & ~of[0]) && !(set[1] & ~of[1]) && !(set[2] & ~of[2]) && !(set[3] & ~of[3]);
}

/* Walks the trie from DFA state `start`; sets the bits (by token id) of the tokens it can read in `out_bits`.
   Nodes are numbered in depth-first preorder: node k's subtree is nodes [k, k + size[k]), and the tokens
   ending in it are end_ids[end_start[k] .. end_start[k + size[k]]).
   `loops` and `known` (see state_loops) hold the start state's loop set; `runs` (see Runs; with `unbuilt`
   they end before an unbuilt row, whose placeholder must not be read) let a subtree readable whole be set at once.
   With `bounds_cap` >= 0, records boundaries: each child that dies right after an accepting state, at
   depth >= 2, as (node, bytes read before it, the accepted label); the caller expands a node to its tokens.
   With `unbuilt` non-null, reaching a state marked there is recorded (not descended) in `unbuilt_hits`.
   `loop` (null: no skipping) is a skip set: every string of its bytes no longer than `loop_len` reads alive
   from `start` (the start state's loop set, or its run: see Runs), and `out_bits` already holds the tokens
   made only of its bytes, no longer than `loop_len`; the subtrees made only of them, on a path made only of
   them, whose tokens are no longer than `loop_len`, are skipped. With `entry` (null: none) the skip starts
   one byte in: a first byte of `entry` leads to where `loop` holds (a region's first member, see rl_region).
   `root_child` (null: none) gives the root's child of each byte (-1: none): the walk goes from one live root
   child straight to the next, where it would read each dead one's node (the root's children lie far apart in
   the arrays, a cache miss each: most of a sparse state's cold walk).
   Returns the boundaries found (more than bounds_cap: call again with room), or -1 for a trie deeper than
   MAX_DEPTH. */
static int64_t rl_walk(int64_t n_nodes, const int64_t *size, const uint8_t *node_byte, const int32_t *height,
                const int64_t *end_start, const int64_t *end_ids, const uint64_t *subtree,
                const int32_t *trans, int64_t width, const int32_t *byte_class, const int32_t *accept,
                uint64_t *loops, uint8_t *known, uint64_t *run_sets, int32_t *run_lens, int32_t *run_next,
                uint8_t *run_known, const uint8_t *unbuilt, int32_t start, const uint64_t *loop,
                const uint64_t *entry, int64_t loop_len, uint8_t *out_bits, int64_t bounds_cap, int64_t *b_node,
                int64_t *b_pos, int64_t *b_label,
                int64_t *unbuilt_hits, int64_t unbuilt_cap, int64_t *n_unbuilt, const int64_t *root_child) {
    Frame stack[MAX_DEPTH + 1];
    int64_t depth = 0, n_bounds = 0, node = 0;
    int root_byte = 0;
    const int32_t *start_row = trans + (int64_t)start * width;
    Runs runs = {run_sets, run_lens, run_next, run_known, unbuilt};
    int use_runs = run_sets != 0;
    *n_unbuilt = 0;
    stack[0] = (Frame){n_nodes, start, 1};
    while (node < n_nodes) {
        while (node >= stack[depth].end) depth--;
        if (depth == 0 && root_child) { /* the next root child whose byte reads alive (they lie in byte order) */
            while (root_byte < 256 && (root_child[root_byte] < node || start_row[byte_class[root_byte]] < 0))
                root_byte++;
            if (root_byte == 256) break;
            node = root_child[root_byte];
        }
        const Frame *f = &stack[depth];
        int64_t past = node + size[node];
        /* a dead child first (most children are): the skips below hold only subtrees whose bytes read alive */
        int32_t nxt = trans[(int64_t)f->state * width + byte_class[node_byte[node]]];
        if (nxt < 0) {
            if (bounds_cap >= 0 && depth >= 1 && accept[f->state] >= 0) {
                if (n_bounds < bounds_cap) {
                    b_node[n_bounds] = node;
                    b_pos[n_bounds] = depth;
                    b_label[n_bounds] = accept[f->state];
                }
                n_bounds++;
            }
            node = past;
            continue;
        }
        const uint64_t *below = subtree + 4 * node;
        if (loop && f->in_loop && (depth || !entry) && depth + height[node] <= loop_len && within(below, loop)) {
            node = past; /* all of its tokens are already set */
            continue;
        }
        if (use_runs && height[node] <= run_len(f->state, trans, width, byte_class, &runs) &&
            within(below, runs.set + 4 * (int64_t)f->state)) {
            /* every path below reads alive: all of the subtree's tokens are readable */
            for (int64_t k = end_start[node]; k < end_start[past]; k++)
                out_bits[end_ids[k] >> 3] |= (uint8_t)(1u << (end_ids[k] & 7));
            node = past;
            continue;
        }
        if (unbuilt && unbuilt[nxt]) {
            if (*n_unbuilt < unbuilt_cap) unbuilt_hits[*n_unbuilt] = nxt;
            (*n_unbuilt)++;
            node = past;
            continue;
        }
        for (int64_t k = end_start[node]; k < end_start[node + 1]; k++)
            out_bits[end_ids[k] >> 3] |= (uint8_t)(1u << (end_ids[k] & 7));
        if (past > node + 1) {
            if (depth + 1 > MAX_DEPTH) return -1;
            /* a byte of the set keeps the path on the loop (or the run): the set is the same there */
            const uint64_t *set = depth || !entry ? loop : entry;
            int32_t in_loop = f->in_loop && loop && (set[node_byte[node] >> 6] >> (node_byte[node] & 63) & 1);
            stack[depth + 1] = (Frame){past, nxt, in_loop};
            depth++;
        }
        node++;
    }
    return n_bounds;
}


/* Walks the bytes of the given vocabulary rows (`matrix` rows of `stride` bytes, `lengths` long) from
   `offsets[k]` on, each from state `start`: the state after the last byte (or -1), and where a walk died, the
   byte position that killed it and the state before it (numpy's walk_rows, token_index.py, does the same). */
void rl_walk_rows(int64_t n, const int64_t *rows, const uint8_t *matrix, int64_t stride, const int64_t *lengths,
                  const int32_t *trans, int64_t width, const int32_t *byte_class, int32_t start,
                  const int64_t *offsets, int64_t *end_state, int64_t *stop_pos, int64_t *stop_state) {
    for (int64_t k = 0; k < n; k++) {
        const uint8_t *data = matrix + rows[k] * stride;
        int32_t q = start;
        int64_t i = offsets[k], len = lengths[rows[k]];
        end_state[k] = -1;
        stop_pos[k] = 0;
        stop_state[k] = start;
        for (; i < len; i++) {
            int32_t nxt = trans[(int64_t)q * width + byte_class[data[i]]];
            if (nxt < 0) {
                stop_pos[k] = i;
                stop_state[k] = q;
                break;
            }
            q = nxt;
        }
        if (i >= len) end_state[k] = q;
    }
}

/* The walk's fixed arguments in one block (set once per DFA by native_trie.py, so a call converts a few
   arguments, not thirty): the trie's arrays, then the DFA's tables and its loop and run caches. */
typedef struct {
    int64_t n_nodes;
    const int64_t *size;
    const uint8_t *node_byte;
    const int32_t *height;
    const int64_t *end_start;
    const int64_t *end_ids;
    const uint64_t *subtree;
    const int32_t *trans;
    int64_t width;
    const int32_t *byte_class;
    const int32_t *accept;
    uint64_t *loops;
    uint8_t *known;
    uint64_t *run_sets;
    int32_t *run_lens;
    int32_t *run_next;
    uint8_t *run_known;
    const uint8_t *unbuilt;
    const int64_t *root_child;
} WalkArgs;

/* The skip set of state q (see rl_walk's `loop`): its loop set if it holds at least `min_bytes` bytes, else
   its run (cut short before an unbuilt row) if it holds that many and is at least `min_len` long, or shorter
   with a dead tail. Writes the set's 4 words, its length (`max_len` for a loop) and whether its tail is dead to
   `out` (6 words); returns 0 where there is none. A run shorter than `max_len` has a dead tail where the state
   after it reads none of its bytes, is built, and (with `boundaries`: a death there would be one) is not
   accepting: a token made only of the run's bytes, longer than the run, then dies at its end (the end of a
   bounded string, whose longer tokens are most of the vocabulary), so those tokens are settled as not read
   (rl_dense_split's `dead_tail`) and only the tokens holding another byte are walked. */
int64_t rl_skip_set(const WalkArgs *a, int32_t q, int64_t min_bytes, int64_t min_len, int64_t max_len,
                    int64_t boundaries, uint64_t *out) {
    out[5] = 0;
    int64_t n = rl_start_loops(q, a->trans, a->width, a->byte_class, a->loops, a->known);
    if (n >= min_bytes) {
        for (int k = 0; k < 4; k++) out[k] = a->loops[4 * (int64_t)q + k];
        out[4] = (uint64_t)max_len;
        return 1;
    }
    if (!a->run_sets) return 0;
    int64_t len;
    n = rl_start_run(q, a->trans, a->width, a->byte_class, a->run_sets, a->run_lens, a->run_next, a->run_known,
                     a->unbuilt, out, &len);
    out[4] = (uint64_t)(len < max_len ? len : max_len);
    if (n < min_bytes) return 0;
    if (len < max_len) {
        int32_t end = q;  /* the run's states all read its bytes into `next` (run_set), so this is every path's */
        for (int64_t i = 0; i < len && end >= 0; i++) end = a->run_next[end];
        int dead = end >= 0 && !(a->unbuilt && a->unbuilt[end]) && !(boundaries && a->accept[end] >= 0);
        const int32_t *row = a->trans + (int64_t)(dead ? end : 0) * a->width;
        for (int b = 0; b < 256 && dead; b++)
            if (out[b >> 6] >> (b & 63) & 1 && row[a->byte_class[b]] >= 0) dead = 0;
        out[5] = (uint64_t)dead;
    }
    return len >= min_len || out[5];
}

/* rl_walk with its fixed arguments in `a`; `scratch` holds the boundaries (3 runs of bounds_cap), then
   unbuilt_cap unbuilt states reached, then their count. */
int64_t rl_walk_args(const WalkArgs *a, int32_t start, const uint64_t *loop, const uint64_t *entry, int64_t loop_len,
                     uint8_t *out_bits, int64_t bounds_cap, int64_t *scratch, int64_t unbuilt_cap) {
    int64_t cap = bounds_cap < 0 ? 0 : bounds_cap;
    return rl_walk(a->n_nodes, a->size, a->node_byte, a->height, a->end_start, a->end_ids, a->subtree, a->trans,
                   a->width, a->byte_class, a->accept, a->loops, a->known, a->run_sets, a->run_lens, a->run_next,
                   a->run_known, a->unbuilt, start, loop, entry, loop_len, out_bits, bounds_cap, scratch, scratch + cap,
                   scratch + 2 * cap, scratch + 3 * cap, unbuilt_cap, scratch + 3 * cap + unbuilt_cap, a->root_child);
}

/* A region around state q, for the walk's skip with `loop` set to the bytes that never leave it (native_trie.py's
   regions): the states a breadth-first search from q finds (at most `max_states`) that lead back to q among those
   found, unbuilt ones left out (their rows must not be read). Inside a string that is its body: the state before
   each UTF-8 continuation or escape byte. A path from q that reads no exit byte (one that leads from some member
   to a live state outside) stays in the region or dies, so which tokens it reads depends on the region alone:
   the caller finds those once per region's shape (`table`) and the walk skips the subtrees made of such bytes.
   Tried only where q loops on at least `min_bytes` bytes (a dense state). Writes, in breadth-first order from q
   (bytes in order: regions alike are numbered alike), each member's row as region numbers (`table`, 256 int16
   per member, -1: dead or leaving) and the exit bytes (`exits`, 4 words); returns how many members, or 0 where
   there is no region worth it (q loops on fewer bytes, or q accepts and `no_accept`). With `no_accept` (a walk
   recording boundaries must see every death after a complete lexeme) accepting states are left out.
   Where q itself does not loop but most of its bytes (`entry`, 4 words, then 1) lead to one state that does
   (a key's first character, where a declared key's letters lead elsewhere), the region is that state's. */
#define REGION_MAX 64
#define SLOTS 256 /* a small open-addressing map from state to its number among those found */

typedef struct {
    int32_t key[SLOTS];
    int8_t at[SLOTS];
} Slots;

static inline int slot_of(const Slots *h, int32_t t) {
    uint32_t k = ((uint32_t)t * 2654435761u) >> 24;
    while (h->key[k] != -1 && h->key[k] != t) k = (k + 1) & (SLOTS - 1);
    return (int)k;
}

static inline int found_at(const Slots *h, int32_t t) { /* t's number among those found, or -1 */
    int k = slot_of(h, t);
    return h->key[k] == t ? h->at[k] : -1;
}

/* The state whose region rl_region builds for q (q itself, or the state one byte in), or -1 where q has none;
   writes `entry` (5 words) as rl_region says. */
static int32_t region_root(const WalkArgs *a, int32_t q, int64_t min_bytes, int64_t no_accept, uint64_t *entry) {
    memset(entry, 0, 40);
    if (rl_start_loops(q, a->trans, a->width, a->byte_class, a->loops, a->known) < min_bytes) {
        /* no loop here: a region one byte in, where most bytes lead (a key's first character, then its body) */
        if (!a->run_sets || (a->unbuilt && a->unbuilt[q])) return -1;
        Runs runs = {a->run_sets, a->run_lens, a->run_next, a->run_known, a->unbuilt};
        run_set(q, a->trans, a->width, a->byte_class, &runs);
        const uint64_t *w = a->run_sets + 4 * (int64_t)q;
        int32_t next = a->run_next[q];
        if (next < 0 || next == q || (a->unbuilt && a->unbuilt[next]) ||
            __builtin_popcountll(w[0]) + __builtin_popcountll(w[1]) + __builtin_popcountll(w[2]) +
            __builtin_popcountll(w[3]) < min_bytes)
            return -1;
        for (int k = 0; k < 4; k++) entry[k] = w[k];
        entry[4] = 1;
        q = next;
        if (rl_start_loops(q, a->trans, a->width, a->byte_class, a->loops, a->known) < min_bytes) return -1;
    }
    return no_accept && a->accept[q] >= 0 ? -1 : q;
}

int64_t rl_region(const WalkArgs *a, int32_t q, int64_t min_bytes, int64_t max_states, int64_t no_accept,
                  int16_t *table, uint64_t *exits, uint64_t *entry) {
    q = region_root(a, q, min_bytes, no_accept, entry);
    if (q < 0) return 0;  /* every region found has a member: q */
    if (max_states > REGION_MAX) max_states = REGION_MAX;
    const uint64_t *loop = a->loops + 4 * (int64_t)q;
    int32_t found[REGION_MAX];
    uint64_t succ[REGION_MAX], loop_succ[REGION_MAX]; /* by number: the found states one byte leads to (on q's loop) */
    uint8_t loop_out[REGION_MAX];                      /* ... and whether a byte of q's loop leads past them */
    uint8_t col_loop[256];
    Slots h;
    memset(h.key, -1, sizeof h.key);
    for (int64_t c = 0; c < a->width; c++) col_loop[c] = 0;
    for (int b = 0; b < 256; b++) /* bytes of one column lead alike: a column is in q's loop whole or not at all */
        if (loop[b >> 6] >> (b & 63) & 1) col_loop[a->byte_class[b]] = 1;
    int64_t n = 1;
    found[0] = q;
    h.key[slot_of(&h, q)] = q, h.at[slot_of(&h, q)] = 0;
    for (int64_t i = 0; i < n; i++) { /* breadth-first, bounded; unbuilt rows are not read */
        succ[i] = loop_succ[i] = 0;
        loop_out[i] = 0;
        if (a->unbuilt && a->unbuilt[found[i]]) continue;
        const int32_t *row = a->trans + (int64_t)found[i] * a->width;
        for (int64_t c = 0; c < a->width; c++) {
            int32_t t = row[c];
            if (t < 0) continue;
            int k = slot_of(&h, t);
            if (h.key[k] != t && n < max_states) h.key[k] = t, h.at[k] = (int8_t)n, found[n++] = t;
            int j = h.key[k] == t ? h.at[k] : -1;
            if (j >= 0) succ[i] |= 1ull << j;
            if (col_loop[c]) {
                if (j >= 0) loop_succ[i] |= 1ull << j;
                else loop_out[i] = 1;
            }
        }
    }
    uint64_t back = 1; /* which lead back to q among those found */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int64_t i = 1; i < n; i++)
            if (!(back >> i & 1) && (succ[i] & back) && !(a->unbuilt && a->unbuilt[found[i]]))
                back |= 1ull << i, changed = 1;
    }
    /* members that would leave on a byte q loops on go (else that byte ends the skip everywhere: a closed
       string's next byte), and so do accepting ones where boundaries are recorded; then what led only to them */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int64_t i = 1; i < n; i++)
            if ((back >> i & 1) && (loop_out[i] || (loop_succ[i] & ~back) || (no_accept && a->accept[found[i]] >= 0)))
                back &= ~(1ull << i), changed = 1;
    }
    int32_t member[REGION_MAX];
    int8_t number[REGION_MAX]; /* by found number: the member number, -1 if not (yet) one */
    memset(number, -1, sizeof number);
    int64_t m = 1;
    member[0] = q, number[0] = 0;
    memset(exits, 0, 32);
    for (int64_t i = 0; i < m; i++) { /* the members in breadth-first order from q, over members only */
        const int32_t *row = a->trans + (int64_t)member[i] * a->width;
        for (int b = 0; b < 256; b++) {
            int32_t t = row[a->byte_class[b]];
            int16_t at = -1;
            if (t >= 0) {
                int j = found_at(&h, t);
                if (j >= 0 && (back >> j & 1)) {
                    if (number[j] < 0) number[j] = (int8_t)m, member[m++] = t;
                    at = number[j];
                } else {
                    exits[b >> 6] |= 1ull << (b & 63);
                }
            }
            table[i * 256 + b] = at;
        }
    }
    return m;
}

/* A state's walk where it has neither a skip set (rl_skip_set) nor, with `regions`, a region (rl_region): most
   states of a schema (a key's letters, a number's digits, punctuation), walked by one call where the caller's
   full path makes three. Returns -2, having walked nothing, where q has either (the caller takes that path: the
   loops and runs found here stay kept); else clears `n_bytes` of `out_bits` and returns rl_walk_args's result. */
int64_t rl_walk_plain(const WalkArgs *a, int32_t q, int64_t min_bytes, int64_t min_len, int64_t max_len,
                      int64_t regions, int64_t boundaries, uint8_t *out_bits, int64_t n_bytes, int64_t bounds_cap,
                      int64_t *scratch, int64_t unbuilt_cap) {
    uint64_t words[6];
    if (rl_skip_set(a, q, min_bytes, min_len, max_len, boundaries, words)) return -2;
    if (regions && region_root(a, q, min_bytes, boundaries, words) >= 0) return -2;
    memset(out_bits, 0, (size_t)n_bytes);
    return rl_walk_args(a, q, NULL, NULL, 0, out_bits, bounds_cap, scratch, unbuilt_cap);
}

/* A canonical signature of what a walk from state q reads (native_trie.py's shared walks): the states reachable
   from q (at most `max_states`; unbuilt ones are not read past), numbered breadth-first from q with bytes in
   order, and the byte classes they tell apart, numbered by their first byte. Two states, of one DFA or of two,
   with the same signature read the same tokens (their walks are the same walk under a renumbering of states), and
   with `labels` (accepted labels written too) record the same boundaries. Writes int32 n, int32 k, each byte's
   class (256 uint8), each class's column (k * n uint8: 2 + the member one byte of it leads to, 1 dead, 0 for an
   unbuilt member), then with `labels` each member's label (n int32, -2 unbuilt); returns the bytes written, or 0
   where q reaches more than `max_states` states (or the DFA has more columns than SIG_WIDTH). `big` (a mark per
   state, kept by the caller) marks the states found to reach more: a search that meets one stops at once. */
#define SIG_MAX 128
#define SIG_SLOTS 512
#define SIG_WIDTH 1024

int64_t rl_signature(const WalkArgs *a, int32_t q, int64_t max_states, int64_t labels, uint8_t *big, uint8_t *out) {
    if (max_states > SIG_MAX) max_states = SIG_MAX;
    if (a->width > SIG_WIDTH || big[q]) return 0;
    /* the DFA's columns in the order of their first byte: a search reading them in that order finds states in the
       order a search reading bytes in order does */
    int16_t cols[256], colpos[SIG_WIDTH];
    int64_t n_cols = 0;
    for (int64_t c = 0; c < a->width; c++) colpos[c] = -1;
    for (int b = 0; b < 256; b++) {
        int32_t c = a->byte_class[b];
        if (colpos[c] < 0) colpos[c] = (int16_t)n_cols, cols[n_cols++] = (int16_t)c;
    }
    int32_t found[SIG_MAX], key[SIG_SLOTS];
    int16_t at[SIG_SLOTS];
    uint8_t target[SIG_MAX * 256]; /* by member and column (in cols' order): 2 + the member it leads to, 1 dead */
    memset(key, -1, sizeof key);
    int64_t n = 1;
    found[0] = q;
    key[((uint32_t)q * 2654435761u) >> 23] = q, at[((uint32_t)q * 2654435761u) >> 23] = 0;
    for (int64_t i = 0; i < n; i++) { /* breadth-first; unbuilt rows are not read */
        uint8_t *to = target + i * n_cols;
        if (a->unbuilt && a->unbuilt[found[i]]) {
            memset(to, 0, (size_t)n_cols);
            continue;
        }
        const int32_t *row = a->trans + (int64_t)found[i] * a->width;
        for (int64_t j = 0; j < n_cols; j++) {
            int32_t t = row[cols[j]];
            if (t < 0) {
                to[j] = 1;
                continue;
            }
            uint32_t k = ((uint32_t)t * 2654435761u) >> 23;
            while (key[k] != -1 && key[k] != t) k = (k + 1) & (SIG_SLOTS - 1);
            if (key[k] != t) {
                if (n == max_states || big[t]) { /* what t reaches, q reaches */
                    big[q] = 1;
                    return 0;
                }
                key[k] = t, at[k] = (int16_t)n, found[n++] = t;
            }
            to[j] = (uint8_t)(2 + at[k]);
        }
    }
    /* classes: columns that read alike over the members are one (a DFA's columns may differ only elsewhere) */
    int32_t *head = (int32_t *)out;
    uint8_t *classes = out + 8, *columns = out + 8 + 256;
    int16_t canon[256];
    uint64_t hash[256];
    int64_t k_cls = 0;
    for (int64_t j = 0; j < n_cols; j++) {
        uint8_t *col = columns + k_cls * n;
        uint64_t h = 1469598103934665603ull;
        for (int64_t i = 0; i < n; i++) col[i] = target[i * n_cols + j], h = (h ^ col[i]) * 1099511628211ull;
        int64_t same = -1;
        for (int64_t c = 0; c < k_cls && same < 0; c++)
            if (hash[c] == h && !memcmp(columns + c * n, col, (size_t)n)) same = c;
        if (same < 0) hash[k_cls] = h, same = k_cls++;
        canon[j] = (int16_t)same;
    }
    for (int b = 0; b < 256; b++) classes[b] = (uint8_t)canon[colpos[a->byte_class[b]]];
    head[0] = (int32_t)n, head[1] = (int32_t)k_cls;
    int64_t size = 8 + 256 + k_cls * n;
    if (labels) {
        size = (size + 3) & ~3;
        int32_t *lab = (int32_t *)(out + size);
        for (int64_t i = 0; i < n; i++)
            lab[i] = a->unbuilt && a->unbuilt[found[i]] ? -2 : a->accept[found[i]];
        size += 4 * n;
    }
    return size;
}

/* A dense state's split of the vocabulary by its skip set (native_trie.py's DenseSplit): the tokens it settles
   (every byte in `set`, at most `max_len` bytes) and the others, its candidates, to be walked one by one. Tokens
   are numbered in the trie's preorder (`rows`: their vocabulary rows; the order rl_walk finds them in, so
   boundaries come out alike). `by_byte` lists, for each byte b, the tokens holding it
   (by_byte[by_byte_start[b] .. by_byte_start[b + 1]]); `longest_first` lists them all by length, longest first
   (`longest_len`: theirs). So the candidates are found from the few tokens holding a byte outside a string's set
   (a quote, a control or a non-ASCII byte), never by a pass over the vocabulary. `seen` is a bitmap over the
   tokens, zero on entry and on return. Writes each candidate's row, id and end offset (`out_ends`, into
   `out_data`, where its bytes go, packed), in preorder, for at most `cap` of them, and `settled`: the bits of
   `all_bits` (every token) without the candidates'. Returns how many candidates, counted no further than cap + 1
   (then nothing else is written). */
int64_t rl_dense_split(const int64_t *by_byte_start, const int32_t *by_byte, const int32_t *longest_first,
                       const int64_t *longest_len, int64_t n_tokens, const int64_t *rows, const int64_t *row_len,
                       const uint8_t *matrix, int64_t stride, const int64_t *ids, const uint8_t *all_bits,
                       int64_t n_bits_bytes, const uint64_t *set, int64_t max_len, int64_t dead_tail, int64_t cap,
                       uint64_t *seen, int64_t *out_rows, int64_t *out_ids, int64_t *out_ends, uint8_t *out_data,
                       uint8_t *settled) {
    int64_t found = mark_outside(by_byte_start, by_byte, set, seen, cap);
    if (dead_tail) { /* the tokens longer than max_len made only of the set's bytes die at the run's end */
        if (found <= cap) {
            memcpy(settled, all_bits, (size_t)n_bits_bytes);
            for (int64_t k = 0; k < n_tokens && longest_len[k] > max_len; k++) {
                int64_t t = longest_first[k];
                if (seen[t >> 6] >> (t & 63) & 1) continue; /* holds another byte: a candidate */
                int64_t id = ids[rows[t]];
                settled[id >> 3] &= (uint8_t)~(1u << (id & 7));
            }
        }
    } else {
        for (int64_t k = 0; k < n_tokens && longest_len[k] > max_len && found <= cap; k++)
            found += mark(seen, longest_first[k]);
        if (found <= cap) memcpy(settled, all_bits, (size_t)n_bits_bytes);
    }
    int64_t words = (n_tokens + 63) / 64, n = 0, at = 0;
    for (int64_t w = 0; w < words; w++) {
        uint64_t bits = seen[w];
        seen[w] = 0;
        while (bits && found <= cap) {
            int64_t t = w * 64 + __builtin_ctzll(bits);
            bits &= bits - 1;
            int64_t r = rows[t];
            out_rows[n] = r;
            out_ids[n] = ids[r];
            settled[ids[r] >> 3] &= (uint8_t)~(1u << (ids[r] & 7));
            memcpy(out_data + at, matrix + r * stride, (size_t)row_len[r]);
            at += row_len[r];
            out_ends[n++] = at;
        }
    }
    return found;
}

/* rl_walk for a dense state, given its candidates (rl_dense_split): `out_bits` already holds the tokens its
   skip set settles, and each candidate's bytes (`data[offsets[k] .. offsets[k + 1]]`: packed together, read in
   order) are walked from `start` alone. A walk that reaches an unbuilt state records it (not read past, the
   token not set); one that dies after an accepting state, a byte or more in, is a boundary (the candidate's
   number k, the bytes read, the label), as rl_walk records them. `scratch` as rl_walk_args's; returns the
   boundaries found (more than bounds_cap: call again with room). */
int64_t rl_walk_candidates(const WalkArgs *a, int32_t start, int64_t n, const int64_t *offsets, const uint8_t *data,
                           const int64_t *ids, uint8_t *out_bits, int64_t bounds_cap, int64_t *scratch,
                           int64_t unbuilt_cap) {
    int64_t cap = bounds_cap < 0 ? 0 : bounds_cap;
    int64_t *b_at = scratch, *b_pos = scratch + cap, *b_label = scratch + 2 * cap;
    int64_t *unbuilt_hits = scratch + 3 * cap, *n_unbuilt = scratch + 3 * cap + unbuilt_cap;
    int64_t n_bounds = 0;
    *n_unbuilt = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t first = offsets[k], i = first, end = offsets[k + 1];
        int32_t q = start;
        for (; i < end; i++) {
            int32_t nxt = a->trans[(int64_t)q * a->width + a->byte_class[data[i]]];
            if (nxt < 0) {
                if (bounds_cap >= 0 && i > first && a->accept[q] >= 0) {
                    if (n_bounds < bounds_cap) {
                        b_at[n_bounds] = k;
                        b_pos[n_bounds] = i - first;
                        b_label[n_bounds] = a->accept[q];
                    }
                    n_bounds++;
                }
                break;
            }
            if (a->unbuilt && a->unbuilt[nxt]) {
                if (*n_unbuilt < unbuilt_cap) unbuilt_hits[*n_unbuilt] = nxt;
                (*n_unbuilt)++;
                break;
            }
            q = nxt;
        }
        if (i == end) out_bits[ids[k] >> 3] |= (uint8_t)(1u << (ids[k] & 7));
    }
    return n_bounds;
}
