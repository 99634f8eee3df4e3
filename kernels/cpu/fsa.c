/* runtime/constrained/regex/fsa.py's loops in C (kernels/cpu/fsa.py loads this): the subset construction
(`subsets`), then trimming's backward reach and minimization's two partitions (`_finite_classes`, `refine`).
Each gives what the Python path gives (test_fsa compares them), so a DFA does not depend on which ran.

The subset construction: the same DFA, numbered alike: a DFA state is the sorted set of the "important" NFA states it holds (those that
read or accept, and the start; the rest only pass on, so sets that differ in those alone are one state), the
start's closure is state 0, and states are numbered as first met: row by row, each row from symbol 0 up.

A row: the state's edges are grouped by symbol set (the caller numbers each shared symbol sequence once), each
group's targets closed and united once; the symbols are then refined into parts read by the same groups (a
part is its parent part plus one group, so a part's set is its groups' union), and each part is looked up once.
*/
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c11 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { OK = 0, TOO_LARGE = 1, DEADLINE = 2, NO_MEMORY = 3 };

typedef struct { /* a growable int32 array */
    int32_t *at;
    int64_t len, cap;
} Vec;

static int vec_room(Vec *v, int64_t extra) {
    if (v->len + extra <= v->cap) return 1;
    int64_t cap = v->cap ? v->cap : 64;
    while (cap < v->len + extra) cap *= 2;
    int32_t *at = realloc(v->at, (size_t)cap * sizeof(int32_t));
    if (!at) return 0;
    v->at = at;
    v->cap = cap;
    return 1;
}

typedef struct {
    int64_t status, num_states, num_symbols;
    Vec rows;        /* [num_states, num_symbols], -1: dead */
    Vec members;     /* each state's set, sorted, one after another */
    int64_t *offset; /* of state s's set in members: offset[s]..offset[s + 1] */
    int64_t offset_cap;
} Result;

static int cmp_int32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void sort_int32(int32_t *a, int64_t n) {
    if (n > 24) {
        qsort(a, (size_t)n, sizeof(int32_t), cmp_int32);
        return;
    }
    for (int64_t i = 1; i < n; i++) {
        int32_t x = a[i];
        int64_t j = i;
        for (; j > 0 && a[j - 1] > x; j--) a[j] = a[j - 1];
        a[j] = x;
    }
}

static uint64_t hash_set(const int32_t *a, int64_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        h ^= (uint32_t)a[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 29;
    }
    return h;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t); /* Python's time.monotonic on Linux */
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct {
    /* the NFA */
    const int64_t *eps_ptr;
    const int32_t *eps;
    const int64_t *edge_ptr;
    const int32_t *edge_set, *edge_target;
    const int64_t *set_ptr;
    const int32_t *set_symbols;
    const uint8_t *important;
    /* closures, computed on first use: closure_of[q] = offset in `closures` (-1: not yet), closure_len[q] */
    int64_t *closure_of, *closure_len;
    Vec closures;
    /* scratch: a stamp per NFA state (`mark` == `stamp`: in the set being built), and the closures' own
       (`walked`, `walk`: a closure is found while a group's set is built) and stack */
    int32_t *mark, *walked, *stack;
    int32_t stamp, walk;
    /* the states' hash table: state id + 1 per slot, 0: empty */
    int32_t *table;
    int64_t table_cap;
} Ctx;

static int32_t next_stamp(int32_t *marks, int32_t *stamp, int64_t n) {
    if (++*stamp == INT32_MAX) {
        memset(marks, 0, (size_t)n * sizeof(int32_t));
        *stamp = 1;
    }
    return *stamp;
}

/* The important states q reaches over empty moves, sorted (in x->closures at closure_of[q]). */
static int closure(Ctx *x, int64_t n, int32_t q) {
    if (x->closure_of[q] >= 0) return 1;
    Vec *c = &x->closures;
    int64_t lo = x->eps_ptr[q], hi = x->eps_ptr[q + 1];
    x->closure_of[q] = c->len;
    if (lo == hi) { /* most targets (a chain of reads): no walk */
        if (!vec_room(c, 1)) return 0;
        if (x->important[q]) c->at[c->len++] = q;
        x->closure_len[q] = c->len - x->closure_of[q];
        return 1;
    }
    int32_t stamp = next_stamp(x->walked, &x->walk, n);
    int64_t top = 0;
    x->walked[q] = stamp;
    x->stack[top++] = q;
    while (top) {
        int32_t s = x->stack[--top];
        if (x->important[s]) {
            if (!vec_room(c, 1)) return 0;
            c->at[c->len++] = s;
        }
        for (int64_t e = x->eps_ptr[s]; e < x->eps_ptr[s + 1]; e++) {
            int32_t t = x->eps[e];
            if (x->walked[t] != stamp) {
                x->walked[t] = stamp;
                x->stack[top++] = t;
            }
        }
    }
    x->closure_len[q] = c->len - x->closure_of[q];
    sort_int32(c->at + x->closure_of[q], x->closure_len[q]);
    return 1;
}

static int grow_table(Ctx *x, Result *r) {
    int64_t cap = x->table_cap ? x->table_cap * 2 : 1024;
    int32_t *table = calloc((size_t)cap, sizeof(int32_t));
    if (!table) return 0;
    for (int64_t s = 0; s < r->num_states; s++) {
        const int32_t *a = r->members.at + r->offset[s];
        uint64_t i = hash_set(a, r->offset[s + 1] - r->offset[s]) & (uint64_t)(cap - 1);
        while (table[i]) i = (i + 1) & (uint64_t)(cap - 1);
        table[i] = (int32_t)(s + 1);
    }
    free(x->table);
    x->table = table;
    x->table_cap = cap;
    return 1;
}

/* The id of the state with set a[0..n) (sorted), a new one if none has it, as fsa.state_id: over `limit`
   states TOO_LARGE, and the deadline read every 256 new states. Returns the id, or -1 - status. */
static int64_t state_id(Ctx *x, Result *r, const int32_t *a, int64_t n, int64_t limit, double deadline) {
    uint64_t mask = (uint64_t)(x->table_cap - 1), i = hash_set(a, n) & mask;
    for (; x->table[i]; i = (i + 1) & mask) {
        int64_t s = x->table[i] - 1, lo = r->offset[s];
        if (r->offset[s + 1] - lo == n && !memcmp(r->members.at + lo, a, (size_t)n * sizeof(int32_t))) return s;
    }
    int64_t s = r->num_states;
    if (s >= limit) return -1 - TOO_LARGE;
    if (!(s & 255) && deadline > 0 && now() > deadline) return -1 - DEADLINE;
    if (s + 2 > r->offset_cap) {
        int64_t cap = r->offset_cap * 2;
        int64_t *offset = realloc(r->offset, (size_t)cap * sizeof(int64_t));
        if (!offset) return -1 - NO_MEMORY;
        r->offset = offset;
        r->offset_cap = cap;
    }
    if (!vec_room(&r->members, n)) return -1 - NO_MEMORY;
    memcpy(r->members.at + r->members.len, a, (size_t)n * sizeof(int32_t));
    r->members.len += n;
    r->offset[s + 1] = r->members.len;
    r->num_states = s + 1;
    x->table[i] = (int32_t)(s + 1);
    if (2 * r->num_states > x->table_cap && !grow_table(x, r)) return -1 - NO_MEMORY;
    return s;
}

/* The rows and sets of the subset construction from `start` (the NFA as arrays: empty moves, edges as (symbol
   set, target) with each set's symbols, the important states). Up to `limit` states; `deadline` is a
   monotonic time (<= 0: none). The result's status says whether it finished; free it with rl_subsets_free. */
Result *rl_subsets(int64_t n, const int64_t *eps_ptr, const int32_t *eps, const int64_t *edge_ptr,
                   const int32_t *edge_set, const int32_t *edge_target, int64_t num_sets, const int64_t *set_ptr,
                   const int32_t *set_symbols, const uint8_t *important, int32_t start, int64_t num_symbols,
                   int64_t limit, double deadline) {
    Result *r = calloc(1, sizeof(Result));
    if (!r) return NULL;
    r->num_symbols = num_symbols;
    r->status = NO_MEMORY;
    Ctx x = {.eps_ptr = eps_ptr, .eps = eps, .edge_ptr = edge_ptr, .edge_set = edge_set, .edge_target = edge_target,
             .set_ptr = set_ptr, .set_symbols = set_symbols, .important = important};
    /* per group (a symbol set read by the state's edges): its slot (-1: not read), its set's offset in
       `sets` and length, its (group, target) pairs; per part: parent part, group, state (-2: not looked up),
       and for refining: the part a group moves it to, stamped by the group */
    int32_t *slot = malloc((size_t)(num_sets ? num_sets : 1) * sizeof(int32_t));
    int32_t *part_of = malloc((size_t)(num_symbols ? num_symbols : 1) * sizeof(int32_t));
    Vec groups = {0}, pairs = {0}, sets = {0}, set_at = {0}, set_len = {0}, count = {0}, part = {0}, row = {0};
    int64_t refine_stamp = 0;
    int64_t *moved_stamp = NULL;
    int64_t moved_cap = 0;
    x.closure_of = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    x.closure_len = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    x.mark = calloc((size_t)(n ? n : 1), sizeof(int32_t));
    x.walked = calloc((size_t)(n ? n : 1), sizeof(int32_t));
    x.stack = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    r->offset_cap = 1024;
    r->offset = malloc((size_t)r->offset_cap * sizeof(int64_t));
    if (!slot || !part_of || !x.closure_of || !x.closure_len || !x.mark || !x.walked || !x.stack || !r->offset ||
        !grow_table(&x, r) || !vec_room(&row, num_symbols))
        goto done;
    memset(slot, 0xff, (size_t)num_sets * sizeof(int32_t));
    memset(x.closure_of, 0xff, (size_t)n * sizeof(int64_t));
    for (int64_t c = 0; c < num_symbols; c++) part_of[c] = 0; /* part 0: read by no group, dead */
    r->offset[0] = 0;
    if (!closure(&x, n, start)) goto done;
    {
        /* the start's closure is copied out first: the closures' array may move as it grows */
        int64_t len = x.closure_len[start];
        if (!vec_room(&sets, len)) goto done;
        memcpy(sets.at, x.closures.at + x.closure_of[start], (size_t)len * sizeof(int32_t));
        if (state_id(&x, r, sets.at, len, 1, 0) < 0) goto done; /* the start: no bound (as fsa) */
    }
    for (int64_t d = 0; d < r->num_states; d++) {
        /* the (group, target) pairs of the state's edges, groups numbered as first read */
        groups.len = pairs.len = 0;
        for (int64_t m = r->offset[d]; m < r->offset[d + 1]; m++) {
            int32_t q = r->members.at[m];
            for (int64_t e = edge_ptr[q]; e < edge_ptr[q + 1]; e++) {
                int32_t s = edge_set[e];
                if (slot[s] < 0) {
                    if (!vec_room(&groups, 1)) goto done;
                    slot[s] = (int32_t)groups.len;
                    groups.at[groups.len++] = s;
                }
                if (!vec_room(&pairs, 2)) goto done;
                pairs.at[pairs.len++] = slot[s];
                pairs.at[pairs.len++] = edge_target[e];
            }
        }
        int64_t num_groups = groups.len;
        /* each group's targets closed and united (sorted, in `sets`) */
        if (!vec_room(&count, num_groups + 1) || !vec_room(&set_at, num_groups) || !vec_room(&set_len, num_groups))
            goto done;
        memset(count.at, 0, (size_t)(num_groups + 1) * sizeof(int32_t));
        for (int64_t p = 0; p < pairs.len; p += 2) count.at[pairs.at[p] + 1]++;
        for (int64_t g = 0; g < num_groups; g++) count.at[g + 1] += count.at[g];
        int64_t num_pairs = pairs.len / 2;
        if (!vec_room(&pairs, num_pairs)) goto done; /* targets by group after the pairs */
        int32_t *by_group = pairs.at + pairs.len;
        for (int64_t p = 0; p < pairs.len; p += 2) by_group[count.at[pairs.at[p]]++] = pairs.at[p + 1];
        sets.len = 0;
        for (int64_t g = 0, lo = 0; g < num_groups; g++) {
            int64_t hi = count.at[g];
            int32_t stamp = next_stamp(x.mark, &x.stamp, n);
            set_at.at[g] = (int32_t)sets.len;
            for (int64_t i = lo; i < hi; i++) {
                int32_t t = by_group[i];
                if (!closure(&x, n, t)) goto done;
                int64_t len = x.closure_len[t];
                const int32_t *c = x.closures.at + x.closure_of[t];
                if (!vec_room(&sets, len)) goto done;
                for (int64_t k = 0; k < len; k++)
                    if (x.mark[c[k]] != stamp) {
                        x.mark[c[k]] = stamp;
                        sets.at[sets.len++] = c[k];
                    }
            }
            set_len.at[g] = (int32_t)(sets.len - set_at.at[g]);
            if (hi - lo > 1) sort_int32(sets.at + set_at.at[g], set_len.at[g]);
            lo = hi;
        }
        for (int64_t g = 0; g < num_groups; g++) slot[groups.at[g]] = -1;
        /* the symbols refined into parts: a group moves each part it reads part of to a new part (its child) */
        part.len = 0;
        if (!vec_room(&part, 3)) goto done;
        part.at[part.len++] = -1; /* part 0: parent */
        part.at[part.len++] = -1; /* group */
        part.at[part.len++] = -2; /* state */
        for (int64_t g = 0; g < num_groups; g++) {
            int32_t s = groups.at[g];
            refine_stamp++;
            for (int64_t k = set_ptr[s]; k < set_ptr[s + 1]; k++) {
                int32_t c = set_symbols[k], p = part_of[c];
                if (p >= moved_cap) {
                    int64_t cap = moved_cap ? moved_cap * 2 : 64;
                    while (cap <= p) cap *= 2;
                    int64_t *grown = realloc(moved_stamp, (size_t)cap * 2 * sizeof(int64_t));
                    if (!grown) goto done;
                    memset(grown + 2 * moved_cap, 0, (size_t)(cap - moved_cap) * 2 * sizeof(int64_t));
                    moved_stamp = grown;
                    moved_cap = cap;
                }
                if (moved_stamp[2 * p] != refine_stamp) {
                    if (!vec_room(&part, 3)) goto done;
                    moved_stamp[2 * p] = refine_stamp;
                    moved_stamp[2 * p + 1] = part.len / 3;
                    part.at[part.len++] = p;
                    part.at[part.len++] = (int32_t)g;
                    part.at[part.len++] = -2;
                }
                part_of[c] = (int32_t)moved_stamp[2 * p + 1];
            }
        }
        /* the row, symbol by symbol: a part's state is looked up where its first symbol is */
        for (int64_t c = 0; c < num_symbols; c++) {
            int32_t p = part_of[c];
            part_of[c] = 0;
            if (!p) {
                row.at[c] = -1;
                continue;
            }
            if (part.at[3 * p + 2] == -2) {
                int32_t parent = part.at[3 * p], g = part.at[3 * p + 1];
                const int32_t *a;
                int64_t len;
                if (!parent) { /* one group: its set as it is */
                    a = sets.at + set_at.at[g];
                    len = set_len.at[g];
                } else { /* the union of the groups on the way to part 0, after the groups' sets */
                    int32_t stamp = next_stamp(x.mark, &x.stamp, n);
                    int64_t base = sets.len;
                    for (int32_t q = p; q; q = part.at[3 * q]) {
                        int32_t h = part.at[3 * q + 1];
                        if (!vec_room(&sets, set_len.at[h])) goto done;
                        for (int64_t k = set_at.at[h]; k < set_at.at[h] + set_len.at[h]; k++)
                            if (x.mark[sets.at[k]] != stamp) {
                                x.mark[sets.at[k]] = stamp;
                                sets.at[sets.len++] = sets.at[k];
                            }
                    }
                    a = sets.at + base;
                    len = sets.len - base;
                    sort_int32(sets.at + base, len);
                }
                int64_t id = state_id(&x, r, a, len, limit, deadline);
                if (id < 0) {
                    r->status = -1 - id;
                    goto out;
                }
                part.at[3 * p + 2] = (int32_t)id;
            }
            row.at[c] = part.at[3 * p + 2];
        }
        if (!vec_room(&r->rows, num_symbols)) goto done;
        memcpy(r->rows.at + r->rows.len, row.at, (size_t)num_symbols * sizeof(int32_t));
        r->rows.len += num_symbols;
    }
    r->status = OK;
    goto out;
done:
    r->status = NO_MEMORY;
out:
    free(slot);
    free(part_of);
    free(groups.at);
    free(pairs.at);
    free(sets.at);
    free(set_at.at);
    free(set_len.at);
    free(count.at);
    free(part.at);
    free(row.at);
    free(moved_stamp);
    free(x.closure_of);
    free(x.closure_len);
    free(x.closures.at);
    free(x.mark);
    free(x.walked);
    free(x.stack);
    free(x.table);
    return r;
}

/* The result's status, number of states and total set length: out[0..3). */
void rl_subsets_shape(const Result *r, int64_t *out) {
    out[0] = r->status;
    out[1] = r->num_states;
    out[2] = r->status == OK ? r->members.len : 0;
}

/* Copies a finished result out: rows [num_states, num_symbols], offsets [num_states + 1], members. */
void rl_subsets_copy(const Result *r, int64_t *rows, int64_t *offset, int32_t *members) {
    for (int64_t i = 0; i < r->rows.len; i++) rows[i] = r->rows.at[i];
    memcpy(offset, r->offset, (size_t)(r->num_states + 1) * sizeof(int64_t));
    memcpy(members, r->members.at, (size_t)r->members.len * sizeof(int32_t));
}

void rl_subsets_free(Result *r) {
    if (!r) return;
    free(r->rows.at);
    free(r->members.at);
    free(r->offset);
    free(r);
}

/* Trimming and minimization over a DFA (trans [n, k], -1: dead; accept [n], -1: none). */

/* The distinct successors of each state as predecessor lists: preds[ptr[t]..ptr[t + 1]) are the states
   with a move into t, each once, ascending; `out_degree` counts each state's distinct successors. */
static int predecessors(int64_t n, int64_t k, const int64_t *trans, int64_t **ptr_out, int32_t **preds_out,
                        int32_t *out_degree) {
    int64_t *ptr = calloc((size_t)n + 1, sizeof(int64_t));
    int32_t *seen = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    int32_t *preds = NULL;
    if (!ptr || !seen) goto fail;
    for (int64_t s = 0; s < n; s++) seen[s] = -1;
    for (int64_t s = 0; s < n; s++) {
        int32_t degree = 0;
        for (int64_t c = 0; c < k; c++) {
            int64_t t = trans[s * k + c];
            if (t >= 0 && seen[t] != s) {
                seen[t] = (int32_t)s;
                ptr[t + 1]++;
                degree++;
            }
        }
        if (out_degree) out_degree[s] = degree;
    }
    for (int64_t t = 0; t < n; t++) ptr[t + 1] += ptr[t];
    preds = malloc((size_t)(ptr[n] ? ptr[n] : 1) * sizeof(int32_t));
    if (!preds) goto fail;
    for (int64_t s = 0; s < n; s++) seen[s] = -1;
    int64_t *fill = ptr; /* ptr[t] runs up to ptr[t + 1] as t's list fills, then is restored */
    for (int64_t s = 0; s < n; s++)
        for (int64_t c = 0; c < k; c++) {
            int64_t t = trans[s * k + c];
            if (t >= 0 && seen[t] != s) {
                seen[t] = (int32_t)s;
                preds[fill[t]++] = (int32_t)s;
            }
        }
    for (int64_t t = n; t > 0; t--) ptr[t] = ptr[t - 1];
    ptr[0] = 0;
    free(seen);
    *ptr_out = ptr;
    *preds_out = preds;
    return 1;
fail:
    free(ptr);
    free(seen);
    free(preds);
    return 0;
}

/* Marks the states that reach an accepting state (`live`, 1 or 0). Returns 0, or -1 out of memory. */
int64_t rl_live(int64_t n, int64_t k, const int64_t *trans, const int64_t *accept, uint8_t *live) {
    int64_t *ptr;
    int32_t *preds, *stack = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!stack || !predecessors(n, k, trans, &ptr, &preds, NULL)) {
        free(stack);
        return -1;
    }
    int64_t top = 0;
    memset(live, 0, (size_t)n);
    for (int64_t s = 0; s < n; s++)
        if (accept[s] >= 0) {
            live[s] = 1;
            stack[top++] = (int32_t)s;
        }
    while (top) {
        int32_t t = stack[--top];
        for (int64_t i = ptr[t]; i < ptr[t + 1]; i++)
            if (!live[preds[i]]) {
                live[preds[i]] = 1;
                stack[top++] = preds[i];
            }
    }
    free(ptr);
    free(preds);
    free(stack);
    return 0;
}

/* fsa._finite_classes: the states that reach no cycle classed from the sinks back, a height at a time (a
   class per distinct (label, successors' classes) in that height), the rest `count + 1 + accept` (count: the
   classes given). Same partition as the Python path (not the same numbers). Returns 0, or -1 out of memory. */
int64_t rl_finite_classes(int64_t n, int64_t k, const int64_t *trans, const int64_t *accept, int64_t *classes) {
    int64_t *ptr, *table = NULL;
    int32_t *preds, *pending = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    int32_t *order = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!pending || !order || !predecessors(n, k, trans, &ptr, &preds, pending)) {
        free(pending);
        free(order);
        return -1;
    }
    int64_t table_cap = 0, count = 0, done = 0, end = 0;
    for (int64_t s = 0; s < n; s++) {
        classes[s] = -1;
        if (!pending[s]) order[end++] = (int32_t)s;
    }
    while (done < end) { /* one height: order[done..level_end) */
        int64_t level_end = end, size = level_end - done, cap = 16;
        while (cap < 2 * size) cap *= 2;
        if (cap > table_cap) {
            free(table);
            table = malloc((size_t)cap * sizeof(int64_t));
            if (!table) {
                count = -1;
                break;
            }
            table_cap = cap;
        }
        for (int64_t i = 0; i < cap; i++) table[i] = -1;
        int64_t fresh = 0;
        for (int64_t i = done; i < level_end; i++) {
            int32_t s = order[i];
            const int64_t *row = trans + s * k;
            uint64_t h = hash_set(NULL, 0) ^ (uint64_t)accept[s];
            for (int64_t c = 0; c < k; c++) {
                h ^= (uint64_t)(row[c] >= 0 ? classes[row[c]] : -1);
                h *= 0xff51afd7ed558ccdull;
                h ^= h >> 29;
            }
            uint64_t j = h & (uint64_t)(cap - 1);
            for (; table[j] >= 0; j = (j + 1) & (uint64_t)(cap - 1)) {
                int64_t o = table[j];
                const int64_t *other = trans + o * k;
                if (accept[o] != accept[s]) continue;
                int64_t c = 0;
                for (; c < k; c++)
                    if ((row[c] >= 0 ? classes[row[c]] : -1) != (other[c] >= 0 ? classes[other[c]] : -1)) break;
                if (c == k) break;
            }
            if (table[j] >= 0) {
                classes[s] = classes[table[j]];
            } else {
                table[j] = s;
                classes[s] = count + fresh++;
            }
            for (int64_t p = ptr[s]; p < ptr[s + 1]; p++)
                if (!--pending[preds[p]]) order[end++] = preds[p];
        }
        count += fresh;
        done = level_end;
    }
    if (count >= 0)
        for (int64_t s = 0; s < n; s++)
            if (classes[s] < 0) classes[s] = count + 1 + accept[s];
    free(table);
    free(ptr);
    free(preds);
    free(pending);
    free(order);
    return count < 0 ? -1 : 0;
}

/* fsa.refine to the end (minimize's partition): Hopcroft's algorithm, O(k n log n) where Moore's rounds grow
   with the DFA's depth. The dead state is state n, a block of its own; two states share a block iff they agree
   on every string (alive or dead, and the label). Same partition as fsa.refine, numbered otherwise (minimize
   reads the partition alone). Writes each state's block to `block`; returns the number of blocks, or -1 out of
   memory. */
typedef struct {
    int64_t label;
    int32_t state;
} Keyed;

static int cmp_keyed(const void *a, const void *b) {
    const Keyed *x = a, *y = b;
    if (x->label != y->label) return (x->label > y->label) - (x->label < y->label);
    return (x->state > y->state) - (x->state < y->state);
}

int64_t rl_refine(int64_t n, int64_t k, const int64_t *trans, const int64_t *labels, int64_t *block) {
    int64_t m = n + 1, count = 0, result = -1; /* states and the dead one */
    int64_t *inv_ptr = calloc((size_t)(m * k + 1), sizeof(int64_t));
    int32_t *inv = malloc((size_t)(m * k + 1) * sizeof(int32_t));
    int32_t *elems = malloc((size_t)m * sizeof(int32_t)), *loc = malloc((size_t)m * sizeof(int32_t));
    int32_t *block_of = malloc((size_t)m * sizeof(int32_t));
    int32_t *first = malloc((size_t)m * sizeof(int32_t)), *end = malloc((size_t)m * sizeof(int32_t));
    int32_t *marked = calloc((size_t)m, sizeof(int32_t)), *touched = malloc((size_t)m * sizeof(int32_t));
    int32_t *found = malloc((size_t)m * sizeof(int32_t));
    uint8_t *queued = calloc((size_t)(m * k + 1), 1);
    int64_t *queue = malloc((size_t)(m * k + 1) * sizeof(int64_t)); /* (block * k + symbol), a stack */
    Keyed *keyed = malloc((size_t)(n ? n : 1) * sizeof(Keyed));
    if (!inv_ptr || !inv || !elems || !loc || !block_of || !first || !end || !marked || !touched || !found ||
        !queued || !queue || !keyed)
        goto out;
    /* who moves into t on c: inv[inv_ptr[t * k + c]..inv_ptr[t * k + c + 1]) */
#define TARGET(s, c) ((s) == n || trans[(s) * k + (c)] < 0 ? n : trans[(s) * k + (c)])
    for (int64_t s = 0; s < m; s++)
        for (int64_t c = 0; c < k; c++) inv_ptr[TARGET(s, c) * k + c + 1]++;
    for (int64_t i = 0; i < m * k; i++) inv_ptr[i + 1] += inv_ptr[i];
    for (int64_t s = 0; s < m; s++)
        for (int64_t c = 0; c < k; c++) inv[inv_ptr[TARGET(s, c) * k + c]++] = (int32_t)s;
    for (int64_t i = m * k; i > 0; i--) inv_ptr[i] = inv_ptr[i - 1];
    inv_ptr[0] = 0;
#undef TARGET
    /* the first blocks: by label, the dead state alone last */
    for (int64_t s = 0; s < n; s++) keyed[s] = (Keyed){labels[s], (int32_t)s};
    qsort(keyed, (size_t)n, sizeof(Keyed), cmp_keyed);
    for (int64_t i = 0; i < n; i++) {
        if (!i || keyed[i].label != keyed[i - 1].label) {
            if (i) end[count - 1] = (int32_t)i;
            first[count++] = (int32_t)i;
        }
        elems[i] = keyed[i].state;
        loc[keyed[i].state] = (int32_t)i;
        block_of[keyed[i].state] = (int32_t)(count - 1);
    }
    if (n) end[count - 1] = (int32_t)n;
    first[count] = (int32_t)n;
    end[count] = (int32_t)m;
    elems[n] = (int32_t)n;
    loc[n] = (int32_t)n;
    block_of[n] = (int32_t)count++;
    int64_t top = 0;
    for (int64_t b = 0; b < count; b++)
        for (int64_t c = 0; c < k; c++) {
            queue[top++] = b * k + c;
            queued[b * k + c] = 1;
        }
    while (top) {
        int64_t splitter = queue[--top], b = splitter / k, c = splitter % k;
        queued[splitter] = 0;
        /* the states moving into b on c, found first (marking reorders blocks, b among them) */
        int64_t num_found = 0, num_touched = 0;
        for (int32_t i = first[b]; i < end[b]; i++) {
            int64_t t = elems[i];
            for (int64_t p = inv_ptr[t * k + c]; p < inv_ptr[t * k + c + 1]; p++) found[num_found++] = inv[p];
        }
        for (int64_t i = 0; i < num_found; i++) { /* marked states move to the front of their block */
            int32_t s = found[i], y = block_of[s], at = first[y] + marked[y], other = elems[at];
            if (!marked[y]) touched[num_touched++] = y;
            elems[loc[s]] = other;
            loc[other] = loc[s];
            elems[at] = s;
            loc[s] = at;
            marked[y]++;
        }
        for (int64_t i = 0; i < num_touched; i++) {
            int32_t y = touched[i], size = end[y] - first[y], split = marked[y];
            marked[y] = 0;
            if (split == size) continue;
            /* the smaller part becomes the new block z */
            int32_t z = (int32_t)count++;
            if (split <= size - split) {
                first[z] = first[y];
                end[z] = first[y] + split;
                first[y] = end[z];
            } else {
                first[z] = first[y] + split;
                end[z] = end[y];
                end[y] = first[z];
            }
            for (int32_t j = first[z]; j < end[z]; j++) block_of[elems[j]] = z;
            /* where (y, d) waits, it now stands for y's rest and z needs its own; where it does not, the
               smaller part is enough: z either way */
            for (int64_t d = 0; d < k; d++) {
                queued[z * k + d] = 1;
                queue[top++] = z * k + d;
            }
        }
    }
    for (int64_t s = 0; s < n; s++) block[s] = block_of[s];
    result = count;
out:
    free(inv_ptr);
    free(inv);
    free(elems);
    free(loc);
    free(block_of);
    free(first);
    free(end);
    free(marked);
    free(touched);
    free(found);
    free(queued);
    free(queue);
    free(keyed);
    return result;
}

/* A lazily built table's rows laid at a new place (runtime/constrained/object_dispatch.py's _shifted): `n` values
   of `src` (a part's transitions) written to `dst` with every live target moved by `offset` (dead, -1, stays).
   One pass, where numpy took four over the rows (each a quarter of a value's stretch's cost). */
void rl_shift_rows(int64_t n, const int32_t *src, int32_t *dst, int32_t offset) {
    for (int64_t i = 0; i < n; i++) dst[i] = src[i] < 0 ? src[i] : src[i] + offset;
}

/* One row of `src`'s values at `columns` into `out`, every live target moved by `offset`. */
static void shift_row(const int32_t *row, const int64_t *columns, int64_t n_columns, int32_t *out, int32_t offset) {
    for (int64_t k = 0; k < n_columns; k++) {
        int32_t t = row[columns[k]];
        out[k] = t < 0 ? t : t + offset;
    }
}

/* rl_shift_rows over a table's columns (object_dispatch.py's narrower table): `n` rows of `width` values of `src`
   (a part's transitions over all 256 bytes), of each only the values at `columns` (`n_columns` of them: each
   column's first byte), written to `dst` with every live target moved by `offset`. One pass over the rows laid. */
void rl_shift_columns(int64_t n, const int32_t *src, int64_t width, const int64_t *columns, int64_t n_columns,
                      int32_t *dst, int32_t offset) {
    for (int64_t i = 0; i < n; i++) shift_row(src + i * width, columns, n_columns, dst + i * n_columns, offset);
}

/* rl_shift_columns of the rows `which` of `src` alone (`n` of them), each written to its own row of `dst`: a value's
   stretch (object_dispatch.py's _lay_rows), whose states lie in many short runs, in one call. */
void rl_shift_rows_at(int64_t n, const int64_t *which, const int32_t *src, int64_t width, const int64_t *columns,
                      int64_t n_columns, int32_t *dst, int32_t offset) {
    for (int64_t j = 0; j < n; j++)
        shift_row(src + which[j] * width, columns, n_columns, dst + which[j] * n_columns, offset);
}

/* Breadth-first distances from `start` over a DFA's `n` rows of `k` columns (object_dispatch.py's _Layers): each
   state's distance in `dist` (-1: not reached), and the states reached in breadth-first order in `order` (by
   distance, so a distance's states are one slice of it); returns how many were reached. */
int64_t rl_distances(int64_t n, int64_t k, const int32_t *trans, int32_t start, int64_t *dist, int32_t *order) {
    for (int64_t s = 0; s < n; s++) dist[s] = -1;
    int64_t head = 0, tail = 0;
    dist[start] = 0;
    order[tail++] = start;
    while (head < tail) {
        int32_t q = order[head++];
        const int32_t *row = trans + (int64_t)q * k;
        for (int64_t c = 0; c < k; c++) {
            int32_t t = row[c];
            if (t >= 0 && dist[t] < 0) {
                dist[t] = dist[q] + 1;
                order[tail++] = t;
            }
        }
    }
    return tail;
}
