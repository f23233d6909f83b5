/* B+ tree of disjoint byte ranges; see range_set.h for why this shape. */
#include "coherence/range_set.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "os/os.h"
#include "os/status.h"

enum {
    RS_B = 32,          /* intervals per leaf, separators per internal node */
    RS_MIN = RS_B / 2,  /* least fill of every node but the root */
    RS_MAX_LEVELS = 24, /* deeper than any tree of 2^64 intervals at least fill */
    RS_POOL_SLACK = 8,  /* spare nodes kept beyond a reservation, against churn */
};

struct mapping_rs_node {
    unsigned n; /* intervals (leaf) or separators (internal) */
    union {
        struct { /* leaf; a spare node is chained through next */
            size_t           lo[RS_B], hi[RS_B];
            mapping_rs_node *prev, *next;
        };
        struct { /* internal: child[i] lies between sep[i - 1] and sep[i] */
            size_t           sep[RS_B];
            mapping_rs_node *child[RS_B + 1];
        };
    };
};

/* One step of a root-to-leaf path: the node and the child (or interval) index. */
typedef struct rs_step {
    mapping_rs_node *node;
    unsigned         i;
} rs_step;

/* First index k with a[k] > pos (n if none); a is ascending, n <= RS_B.
 * Every cache line of the array is requested first, so that a node missing
 * from the cache costs about one memory latency rather than one per halving
 * step; the halving steps then compile to conditional moves. */
static unsigned first_above(const size_t *a, unsigned n, size_t pos)
{
    for (unsigned k = 0; k < RS_B; k += 64 / sizeof *a)
        __builtin_prefetch(a + k);
    unsigned i = 0; /* a[0..i) <= pos */
    for (unsigned step = RS_B; step > 0; step /= 2)
        if (i + step <= n && a[i + step - 1] <= pos)
            i += step;
    return i;
}

/* The leaf whose span holds pos, recording the path (every level, leaf last,
 * its index = first interval with hi > pos, possibly n). For an interval
 * [lo, hi) of the set, descend(lo) reaches exactly its leaf and index. */
static mapping_rs_node *descend(const mapping_range_set *s, size_t pos, rs_step *path)
{
    mapping_rs_node *node = s->root;
    for (unsigned d = 0; d + 1 < s->levels; d++) {
        unsigned i = first_above(node->sep, node->n, pos);
        path[d] = (rs_step){node, i};
        node = node->child[i];
    }
    for (unsigned k = 0; k < RS_B; k += 64 / sizeof *node->lo) /* read next, and moved on insertion */
        __builtin_prefetch(node->lo + k);
    path[s->levels - 1] = (rs_step){node, first_above(node->hi, node->n, pos)};
    return node;
}

/* The first interval with hi > pos: its leaf (NULL if none) and *j. */
static mapping_rs_node *find(const mapping_range_set *s, size_t pos, unsigned *j)
{
    if (!s->root)
        return NULL;
    mapping_rs_node *node = s->root;
    for (unsigned d = 0; d + 1 < s->levels; d++)
        node = node->child[first_above(node->sep, node->n, pos)];
    *j = first_above(node->hi, node->n, pos);
    if (*j < node->n)
        return node;
    /* Everything here ends at or before pos; the next leaf starts past its separator, so past pos. */
    *j = 0;
    return node->next;
}

/* ---- nodes and the pool ---- */

static mapping_rs_node *node_take(mapping_range_set *s)
{
    mapping_rs_node *node = s->pool; /* never NULL: every caller made sure of the pool first */
    s->pool = node->next;
    s->spare--;
    s->nodes++;
    return node;
}

static void node_give(mapping_range_set *s, mapping_rs_node *node)
{
    node->next = s->pool;
    s->pool = node;
    s->spare++;
    s->nodes--;
}

/* Upper bounds on the nodes and levels of any tree of n intervals (every
 * node but the root at least half full). */
static void tree_bounds(size_t n, size_t *nodes, unsigned *levels)
{
    if (n <= RS_B) {
        *nodes = *levels = n > 0;
        return;
    }
    size_t x = n / RS_MIN, sum = x;
    unsigned lv = 1;
    while (x > 1) {
        x = x <= RS_B + 1 ? 1 : x / (RS_MIN + 1);
        sum += x;
        lv++;
    }
    *nodes = sum;
    *levels = lv;
}

/* Spare nodes that make `extra` interval-creating operations safe. Two
 * bounds, both sound; the smaller wins. An insertion takes at most one node
 * per level plus a new root. And nodes only move between tree and pool, so
 * tree + pool >= the most any tree of count + extra intervals can use. */
static size_t spare_needed(const mapping_range_set *s, size_t extra)
{
    size_t most;
    unsigned levels;
    tree_bounds(s->count + extra, &most, &levels);
    size_t by_nodes = most > s->nodes ? most - s->nodes : 0;
    size_t by_ops = extra * (levels + 1);
    return by_ops < by_nodes ? by_ops : by_nodes;
}

static mapping_status pool_fill(mapping_range_set *s, size_t need)
{
    while (s->spare < need) {
        mapping_rs_node *node = mapping_os_malloc(sizeof *node);
        if (!node)
            return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "range set: cannot grow to %zu nodes",
                                 s->nodes + s->spare + 1);
        node->next = s->pool;
        s->pool = node;
        s->spare++;
    }
    return MAPPING_OK;
}

static void pool_trim(mapping_range_set *s, size_t keep)
{
    while (s->spare > keep) {
        mapping_rs_node *node = s->pool;
        s->pool = node->next;
        s->spare--;
        free(node);
    }
}

mapping_status mapping__rs_reserve(mapping_range_set *s, size_t extra)
{
    if (extra > (SIZE_MAX - s->count) / (RS_MAX_LEVELS + 1))
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "range set: cannot reserve %zu more ranges", extra);
    size_t need = spare_needed(s, extra);
    mapping_status status = pool_fill(s, need);
    if (status == MAPPING_OK)
        pool_trim(s, need + RS_POOL_SLACK);
    return status;
}

/* Before creating one interval outside a reservation; never trims, so that a
 * caller's reservation for several operations survives. */
static mapping_status ensure_one(mapping_range_set *s)
{
    return pool_fill(s, spare_needed(s, 1));
}

void mapping__rs_init(mapping_range_set *s)
{
    memset(s, 0, sizeof *s);
}

static void free_subtree(mapping_rs_node *node, unsigned levels)
{
    if (levels > 1)
        for (unsigned i = 0; i <= node->n; i++)
            free_subtree(node->child[i], levels - 1);
    free(node);
}

void mapping__rs_free(mapping_range_set *s)
{
    if (s->root)
        free_subtree(s->root, s->levels);
    pool_trim(s, 0);
    memset(s, 0, sizeof *s);
}

/* ---- growing: insertion and splits ---- */

/* A full leaf, child ci of p, appended to ([lo, hi) goes after its last
 * interval) shares with its left sibling when that has room, as in a B*
 * tree: ranges marked in order then fill leaves almost completely instead of
 * leaving every split leaf half empty, and no node is needed. False when
 * there is no such sibling. */
static bool share_with_sibling(mapping_rs_node *p, unsigned ci, size_t lo, size_t hi)
{
    if (ci == 0 || p->child[ci - 1]->n >= RS_B - 1)
        return false;
    unsigned k = ci - 1; /* the pair is p->child[k], [k + 1] */
    mapping_rs_node *a = p->child[k], *b = p->child[k + 1];
    size_t tlo[2 * RS_B], thi[2 * RS_B];
    unsigned t = 0;
    for (unsigned q = 0; q < a->n; q++, t++)
        tlo[t] = a->lo[q], thi[t] = a->hi[q];
    for (unsigned q = 0; q < b->n; q++, t++)
        tlo[t] = b->lo[q], thi[t] = b->hi[q];
    tlo[t] = lo;
    thi[t] = hi;
    t++;
    a->n = t / 2;
    b->n = t - a->n;
    memcpy(a->lo, tlo, a->n * sizeof *tlo);
    memcpy(a->hi, thi, a->n * sizeof *thi);
    memcpy(b->lo, tlo + a->n, b->n * sizeof *tlo);
    memcpy(b->hi, thi + a->n, b->n * sizeof *thi);
    p->sep[k] = a->hi[a->n - 1];
    return true;
}

/* [lo, hi) at position j of a leaf that has room. */
static inline void leaf_insert(mapping_rs_node *leaf, unsigned j, size_t lo, size_t hi)
{
    memmove(leaf->lo + j + 1, leaf->lo + j, (leaf->n - j) * sizeof *leaf->lo);
    memmove(leaf->hi + j + 1, leaf->hi + j, (leaf->n - j) * sizeof *leaf->hi);
    leaf->lo[j] = lo;
    leaf->hi[j] = hi;
    leaf->n++;
}

/* Splits a full leaf around [lo, hi) at position j: B + 1 intervals, 17
 * stay, 16 move to a new right neighbour (linked into the leaf list).
 * Returns the new leaf; *up is where the gap after the left half starts,
 * the separator for the parent. */
static mapping_rs_node *leaf_split(mapping_range_set *s, mapping_rs_node *leaf, unsigned j, size_t lo, size_t hi,
                                   size_t *up)
{
    size_t tlo[RS_B + 1], thi[RS_B + 1];
    memcpy(tlo, leaf->lo, j * sizeof *tlo);
    memcpy(thi, leaf->hi, j * sizeof *thi);
    tlo[j] = lo;
    thi[j] = hi;
    memcpy(tlo + j + 1, leaf->lo + j, (RS_B - j) * sizeof *tlo);
    memcpy(thi + j + 1, leaf->hi + j, (RS_B - j) * sizeof *thi);
    mapping_rs_node *right = node_take(s);
    unsigned nl = (RS_B + 2) / 2;
    leaf->n = nl;
    right->n = RS_B + 1 - nl;
    memcpy(leaf->lo, tlo, nl * sizeof *tlo);
    memcpy(leaf->hi, thi, nl * sizeof *thi);
    memcpy(right->lo, tlo + nl, right->n * sizeof *tlo);
    memcpy(right->hi, thi + nl, right->n * sizeof *thi);
    right->prev = leaf;
    right->next = leaf->next;
    if (leaf->next)
        leaf->next->prev = right;
    else
        s->last = right;
    leaf->next = right;
    *up = leaf->hi[nl - 1];
    return right;
}

/* Puts (*up, *child) right after child ci of internal node p. When p is
 * full it splits (B + 1 separators: 16 stay, 1 goes up, 16 move right):
 * returns true and sets (*up, *child) to what its parent must take. */
static bool internal_insert(mapping_range_set *s, mapping_rs_node *p, unsigned ci, size_t *up,
                            mapping_rs_node **child)
{
    if (p->n < RS_B) {
        memmove(p->sep + ci + 1, p->sep + ci, (p->n - ci) * sizeof *p->sep);
        memmove(p->child + ci + 2, p->child + ci + 1, (p->n - ci) * sizeof *p->child);
        p->sep[ci] = *up;
        p->child[ci + 1] = *child;
        p->n++;
        return false;
    }
    size_t ts[RS_B + 1];
    mapping_rs_node *tc[RS_B + 2];
    memcpy(ts, p->sep, ci * sizeof *ts);
    ts[ci] = *up;
    memcpy(ts + ci + 1, p->sep + ci, (RS_B - ci) * sizeof *ts);
    memcpy(tc, p->child, (ci + 1) * sizeof *tc);
    tc[ci + 1] = *child;
    memcpy(tc + ci + 2, p->child + ci + 1, (RS_B - ci) * sizeof *tc);
    mapping_rs_node *r = node_take(s);
    unsigned ml = RS_B / 2;
    p->n = ml;
    memcpy(p->sep, ts, ml * sizeof *ts);
    memcpy(p->child, tc, (ml + 1) * sizeof *tc);
    r->n = RS_B - ml;
    memcpy(r->sep, ts + ml + 1, r->n * sizeof *ts);
    memcpy(r->child, tc + ml + 1, (r->n + 1) * sizeof *tc);
    *up = ts[ml];
    *child = r;
    return true;
}

/* A new root over the old one and `right`, separated at up. */
static void grow_root(mapping_range_set *s, size_t up, mapping_rs_node *right)
{
    mapping_rs_node *root = node_take(s);
    root->n = 1;
    root->sep[0] = up;
    root->child[0] = s->root;
    root->child[1] = right;
    s->root = root;
    s->levels++;
}

/* Inserts [lo, hi) at index j of the leaf at the end of path, splitting full
 * nodes upwards. The pool holds enough nodes. */
static void insert_at(mapping_range_set *s, rs_step *path, unsigned j, size_t lo, size_t hi)
{
    unsigned d = s->levels - 1;
    mapping_rs_node *leaf = path[d].node;
    s->count++;
    if (leaf->n < RS_B) {
        leaf_insert(leaf, j, lo, hi);
        return;
    }
    if (d > 0 && j == RS_B && share_with_sibling(path[d - 1].node, path[d - 1].i, lo, hi))
        return;
    size_t up;
    mapping_rs_node *child = leaf_split(s, leaf, j, lo, hi, &up);
    while (d > 0) { /* the node just split is child path[d].i of its parent */
        --d;
        if (!internal_insert(s, path[d].node, path[d].i, &up, &child))
            return;
    }
    grow_root(s, up, child);
}

/* The first interval of an empty set. The pool holds a node. */
static void insert_first(mapping_range_set *s, size_t lo, size_t hi)
{
    mapping_rs_node *leaf = node_take(s);
    leaf->n = 1;
    leaf->lo[0] = lo;
    leaf->hi[0] = hi;
    leaf->prev = leaf->next = NULL;
    s->root = s->first = s->last = leaf;
    s->levels = 1;
    s->count = 1;
}

/* Before inserting [lo, hi), which touches nothing, at the leaf of a path
 * found with descend(lo - 1) or descend(lo): a separator on the path right
 * of it lies in the gap [lo, hi) falls into; it moves past hi. */
static void clear_path(const mapping_range_set *s, const rs_step *path, size_t hi)
{
    for (unsigned d = 0; d + 1 < s->levels; d++) {
        mapping_rs_node *node = path[d].node;
        unsigned i = path[d].i;
        if (i < node->n && node->sep[i] < hi)
            node->sep[i] = hi;
    }
}

/* After the interval on path grew to [lo, hi): separators beside it on the
 * path move out of its way (they stay in the gaps around it). */
static void widen_path(const mapping_range_set *s, const rs_step *path, size_t lo, size_t hi)
{
    for (unsigned d = 0; d + 1 < s->levels; d++) {
        mapping_rs_node *node = path[d].node;
        unsigned i = path[d].i;
        if (i > 0 && node->sep[i - 1] > lo)
            node->sep[i - 1] = lo;
        if (i < node->n && node->sep[i] < hi)
            node->sep[i] = hi;
    }
}

/* ---- shrinking: deletion, merges and redistribution ---- */

/* Removes separator k and child k + 1 of p. */
static void drop_child(mapping_rs_node *p, unsigned k)
{
    memmove(p->sep + k, p->sep + k + 1, (p->n - k - 1) * sizeof *p->sep);
    memmove(p->child + k + 1, p->child + k + 2, (p->n - k - 1) * sizeof *p->child);
    p->n--;
}

/* Leaves p->child[k], [k + 1]: merged into the left one when they fit (true),
 * else shared evenly (false). */
static bool leaves_balance(mapping_range_set *s, mapping_rs_node *p, unsigned k)
{
    mapping_rs_node *a = p->child[k], *b = p->child[k + 1];
    unsigned t = a->n + b->n;
    if (t <= RS_B) {
        memcpy(a->lo + a->n, b->lo, b->n * sizeof *b->lo);
        memcpy(a->hi + a->n, b->hi, b->n * sizeof *b->hi);
        a->n = t;
        a->next = b->next;
        if (b->next)
            b->next->prev = a;
        else
            s->last = a;
        drop_child(p, k);
        node_give(s, b);
        return true;
    }
    unsigned na = t / 2;
    if (a->n > na) { /* a's tail moves to the front of b */
        unsigned m = a->n - na;
        memmove(b->lo + m, b->lo, b->n * sizeof *b->lo);
        memmove(b->hi + m, b->hi, b->n * sizeof *b->hi);
        memcpy(b->lo, a->lo + na, m * sizeof *b->lo);
        memcpy(b->hi, a->hi + na, m * sizeof *b->hi);
    } else { /* b's head moves to the end of a */
        unsigned m = na - a->n;
        memcpy(a->lo + a->n, b->lo, m * sizeof *a->lo);
        memcpy(a->hi + a->n, b->hi, m * sizeof *a->hi);
        memmove(b->lo, b->lo + m, (b->n - m) * sizeof *b->lo);
        memmove(b->hi, b->hi + m, (b->n - m) * sizeof *b->hi);
    }
    a->n = na;
    b->n = t - na;
    p->sep[k] = a->hi[na - 1];
    return false;
}

/* The same for internal nodes; the separator between them joins the keys. */
static bool inners_balance(mapping_range_set *s, mapping_rs_node *p, unsigned k)
{
    mapping_rs_node *a = p->child[k], *b = p->child[k + 1];
    unsigned t = a->n + b->n + 1;
    if (t <= RS_B) {
        a->sep[a->n] = p->sep[k];
        memcpy(a->sep + a->n + 1, b->sep, b->n * sizeof *b->sep);
        memcpy(a->child + a->n + 1, b->child, (b->n + 1) * sizeof *b->child);
        a->n = t;
        drop_child(p, k);
        node_give(s, b);
        return true;
    }
    size_t ts[2 * RS_B + 1];
    mapping_rs_node *tc[2 * RS_B + 2];
    memcpy(ts, a->sep, a->n * sizeof *ts);
    ts[a->n] = p->sep[k];
    memcpy(ts + a->n + 1, b->sep, b->n * sizeof *ts);
    memcpy(tc, a->child, (a->n + 1) * sizeof *tc);
    memcpy(tc + a->n + 1, b->child, (b->n + 1) * sizeof *tc);
    unsigned na = t / 2;
    a->n = na;
    memcpy(a->sep, ts, na * sizeof *ts);
    memcpy(a->child, tc, (na + 1) * sizeof *tc);
    p->sep[k] = ts[na];
    b->n = t - na - 1;
    memcpy(b->sep, ts + na + 1, b->n * sizeof *ts);
    memcpy(b->child, tc + na + 1, (b->n + 1) * sizeof *tc);
    return false;
}

/* Restores the fill of the nodes on path after the leaf lost intervals. */
static void rebalance(mapping_range_set *s, const rs_step *path)
{
    for (unsigned d = s->levels - 1; d > 0; d--) {
        if (path[d].node->n >= RS_MIN)
            break;
        mapping_rs_node *p = path[d - 1].node;
        unsigned ci = path[d - 1].i, k = ci > 0 ? ci - 1 : 0;
        bool merged = d == s->levels - 1 ? leaves_balance(s, p, k) : inners_balance(s, p, k);
        if (!merged)
            break;
    }
    mapping_rs_node *root = s->root;
    if (root->n > 0)
        return;
    if (s->levels == 1) { /* the last interval went */
        node_give(s, root);
        s->root = s->first = s->last = NULL;
        s->levels = 0;
    } else { /* one child left: it becomes the root */
        s->root = root->child[0];
        node_give(s, root);
        s->levels--;
    }
}

/* Deletes intervals j, j + 1, ... of the path's leaf while they end at or
 * before hi_limit. */
static void erase_run(mapping_range_set *s, rs_step *path, size_t hi_limit)
{
    mapping_rs_node *leaf = path[s->levels - 1].node;
    unsigned j = path[s->levels - 1].i, e = j;
    while (e < leaf->n && leaf->hi[e] <= hi_limit) {
        s->total -= leaf->hi[e] - leaf->lo[e];
        e++;
    }
    memmove(leaf->lo + j, leaf->lo + e, (leaf->n - e) * sizeof *leaf->lo);
    memmove(leaf->hi + j, leaf->hi + e, (leaf->n - e) * sizeof *leaf->hi);
    leaf->n -= e - j;
    s->count -= e - j;
    rebalance(s, path);
}

/* Deletes every interval that ends past `from` and at or before `to`, a
 * leaf's run at a time: O((1 + k / 16) log n + k). */
static void erase_ending_in(mapping_range_set *s, size_t from, size_t to)
{
    rs_step path[RS_MAX_LEVELS];
    unsigned j;
    mapping_rs_node *leaf;
    while ((leaf = find(s, from, &j)) && leaf->hi[j] <= to) {
        descend(s, leaf->lo[j], path);
        erase_run(s, path, to);
    }
}

/* ---- the operations ---- */

/* The interval at index j of leaf, or else the first of the next leaf. */
static bool here_or_next(const mapping_rs_node *leaf, unsigned j, mapping_rs_cursor *c, mapping_range *r)
{
    if (j >= leaf->n) {
        leaf = leaf->next;
        j = 0;
        if (!leaf)
            return false;
    }
    *c = (mapping_rs_cursor){leaf, j};
    *r = (mapping_range){leaf->lo[j], leaf->hi[j]};
    return true;
}

mapping_status mapping__rs_add(mapping_range_set *s, size_t lo, size_t hi)
{
    if (lo >= hi)
        return MAPPING_OK;
    mapping_status status;
    if (!s->root) {
        if ((status = ensure_one(s)))
            return status;
        insert_first(s, lo, hi);
        s->total = hi - lo;
        return MAPPING_OK;
    }
    /* The first interval that touches or follows lo (adjacent ones merge too). */
    rs_step path[RS_MAX_LEVELS];
    mapping_rs_node *leaf = descend(s, lo > 0 ? lo - 1 : 0, path);
    unsigned j = path[s->levels - 1].i;
    mapping_rs_cursor c;
    mapping_range r;
    if (!here_or_next(leaf, j, &c, &r) || r.lo > hi) { /* nothing touched: insert here */
        if ((status = ensure_one(s)))
            return status;
        clear_path(s, path, hi);
        insert_at(s, path, j, lo, hi);
        s->total += hi - lo;
        return MAPPING_OK;
    }
    /* Walk to the last touched interval; it absorbs the others. */
    size_t nlo = r.lo < lo ? r.lo : lo, touched = 0, last_lo, last_hi;
    do {
        touched++;
        last_lo = r.lo;
        last_hi = r.hi;
    } while (mapping__rs_next(&c, &r) && r.lo <= hi);
    size_t nhi = last_hi > hi ? last_hi : hi;
    if (touched == 1 && nlo == last_lo && nhi == last_hi)
        return MAPPING_OK; /* already inside */
    if (touched > 1 || j >= leaf->n) { /* the path above is not the last one's */
        if (touched > 1)
            erase_ending_in(s, lo > 0 ? lo - 1 : 0, last_hi - 1);
        leaf = descend(s, last_lo, path);
        j = path[s->levels - 1].i;
    }
    leaf->lo[j] = nlo;
    leaf->hi[j] = nhi;
    widen_path(s, path, nlo, nhi);
    s->total = s->total - (last_hi - last_lo) + (nhi - nlo);
    return MAPPING_OK;
}

mapping_status mapping__rs_remove(mapping_range_set *s, size_t lo, size_t hi)
{
    if (lo >= hi || !s->root)
        return MAPPING_OK;
    rs_step path[RS_MAX_LEVELS];
    mapping_rs_node *leaf = descend(s, lo, path);
    unsigned j = path[s->levels - 1].i;
    mapping_rs_cursor c;
    mapping_range r;
    if (!here_or_next(leaf, j, &c, &r) || r.lo >= hi)
        return MAPPING_OK;
    if (r.lo < lo && r.hi > hi) { /* strictly inside one interval, which holds lo: on the path */
        mapping_status status = ensure_one(s);
        if (status != MAPPING_OK)
            return status;
        leaf->hi[j] = lo;
        insert_at(s, path, j + 1, hi, r.hi);
        s->total -= hi - lo;
        return MAPPING_OK;
    }
    if (r.lo < lo) { /* trim the tail of the first (it holds lo: on the path) */
        s->total -= r.hi - lo;
        leaf->hi[j] = lo;
    }
    erase_ending_in(s, lo, hi); /* whole intervals inside */
    unsigned k;
    leaf = find(s, lo, &k);
    if (leaf && leaf->lo[k] < hi) { /* trim the head of the last */
        s->total -= hi - leaf->lo[k];
        leaf->lo[k] = hi;
    }
    return MAPPING_OK;
}

static bool           rebuild_pays(const mapping_range_set *s, size_t k);
static mapping_status remove_by_rebuild(mapping_range_set *s, const mapping_range *r, size_t k);

mapping_status mapping__rs_remove_sorted(mapping_range_set *s, const mapping_range *r, size_t k)
{
    if (k == 0 || !s->root)
        return MAPPING_OK;
    if (k == 1)
        return mapping__rs_remove(s, r[0].lo, r[0].hi);
    if (rebuild_pays(s, k))
        return remove_by_rebuild(s, r, k);
    /* A removal splits only an interval that strictly contains it; earlier
     * removals (to its left) only shrink that interval. */
    size_t splits = 0;
    for (size_t q = 0; q < k; q++) {
        unsigned j;
        mapping_rs_node *leaf = find(s, r[q].lo, &j);
        splits += leaf && leaf->lo[j] < r[q].lo && leaf->hi[j] > r[q].hi;
    }
    mapping_status status = mapping__rs_reserve(s, splits);
    if (status != MAPPING_OK)
        return status;
    for (size_t q = 0; q < k; q++)
        mapping__rs_remove(s, r[q].lo, r[q].hi); /* cannot fail: reserved */
    pool_trim(s, RS_POOL_SLACK); /* nodes freed by a large removal go back */
    return MAPPING_OK;
}

/* ---- bulk: rebuilding the tree from a sorted array ---- */

/* The same set built afresh from v[0..m) (sorted, disjoint, not adjacent):
 * leaves and internal nodes filled evenly (at least half full), O(m). The
 * spare pool carries over. All or nothing: on failure s is unchanged. */
/* Nodes a rebuild of m intervals makes: its leaves and the levels above. */
static size_t rebuild_nodes(size_t m)
{
    size_t c = (m + RS_B - 1) / RS_B, total = c;
    while (c > 1) {
        c = (c + RS_B) / (RS_B + 1);
        total += c;
    }
    return total;
}

/* Pushes every node of a subtree onto *list (chained through next). */
static void harvest(mapping_rs_node *node, unsigned levels, mapping_rs_node **list)
{
    if (levels > 1)
        for (unsigned i = 0; i <= node->n; i++)
            harvest(node->child[i], levels - 1, list);
    node->next = *list;
    *list = node;
}

static mapping_rs_node *list_take(mapping_rs_node **list)
{
    mapping_rs_node *node = *list;
    *list = node->next;
    return node;
}

/* Allocates the nodes a rebuild lacks (need - have), chained onto *list in
 * the order malloc gave them (usually rising addresses, so the leaves made
 * from them lie in memory as they are walked). False: none is kept. */
static bool supply_fresh(size_t have, size_t need, mapping_rs_node **list)
{
    mapping_rs_node **tail = list, *node;
    for (; have < need; have++, tail = &node->next) {
        if (!(node = mapping_os_malloc(sizeof *node))) {
            while (*list)
                free(list_take(list));
            return false;
        }
        node->next = NULL;
        *tail = node;
    }
    return true;
}

/* The old tree's nodes and the pool, onto *list: the supply of the new tree. */
static void supply_old(mapping_range_set *s, mapping_rs_node **list)
{
    if (s->root)
        harvest(s->root, s->levels, list);
    while (s->pool) {
        mapping_rs_node *node = s->pool;
        s->pool = node->next;
        node->next = *list;
        *list = node;
    }
}

/* The leaves of t over v[0, m): filled evenly, linked, into level[] with
 * the last hi of each into last[]. */
static void build_leaves(mapping_range_set *t, const mapping_range *v, size_t m, size_t leaves,
                         mapping_rs_node **list, mapping_rs_node **level, size_t *last)
{
    size_t at = 0;
    for (size_t i = 0; i < leaves; i++) {
        mapping_rs_node *leaf = list_take(list);
        size_t take = m / leaves + (i < m % leaves);
        leaf->n = (unsigned)take;
        for (size_t q = 0; q < take; q++, at++) {
            leaf->lo[q] = v[at].lo;
            leaf->hi[q] = v[at].hi;
            t->total += v[at].hi - v[at].lo;
        }
        leaf->prev = i ? level[i - 1] : NULL;
        leaf->next = NULL;
        if (i)
            level[i - 1]->next = leaf;
        level[i] = leaf;
        last[i] = leaf->hi[take - 1];
    }
    t->first = level[0];
    t->last = level[leaves - 1];
    t->levels = 1;
    t->nodes = leaves;
    t->count = m;
}

/* The internal levels of t over the c nodes of level[] (separators from
 * last[]), up to the root. */
static void build_upper(mapping_range_set *t, size_t c, mapping_rs_node **list, mapping_rs_node **level, size_t *last)
{
    for (; c > 1; t->levels++) { /* c nodes at this level: parents over them */
        size_t parents = (c + RS_B) / (RS_B + 1), k = 0;
        for (size_t p = 0; p < parents; p++) {
            mapping_rs_node *node = list_take(list);
            size_t take = c / parents + (p < c % parents);
            node->n = (unsigned)(take - 1);
            for (size_t q = 0; q < take; q++, k++) {
                node->child[q] = level[k];
                if (q + 1 < take)
                    node->sep[q] = last[k];
            }
            last[p] = last[k - 1];
            level[p] = node;
        }
        t->nodes += parents;
        c = parents;
    }
    t->root = level[0];
}

/* Replaces the set by the sorted, disjoint, non-touching v[0, m). The old
 * tree's nodes and the pool are reused for the new tree (a rebuild of a
 * large set would otherwise allocate all of its nodes anew while the old
 * ones are still held, and then free them: fresh pages each time); only
 * the nodes missing are allocated, first, so that a failure changes nothing. */
static mapping_status rebuild(mapping_range_set *s, const mapping_range *v, size_t m)
{
    size_t need = m ? rebuild_nodes(m) : 0, keep_spare = s->spare, leaves = (m + RS_B - 1) / RS_B;
    mapping_rs_node *list = NULL;
    mapping_rs_node **level = m ? mapping_os_malloc(leaves * sizeof *level) : NULL;
    size_t *last = m ? mapping_os_malloc(leaves * sizeof *last) : NULL; /* the last hi under each node of the level */
    if ((m && (!level || !last)) || !supply_fresh(s->nodes + s->spare, need, &list)) {
        free(level);
        free(last);
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "range set: cannot rebuild %zu ranges", m);
    }
    /* From here nothing fails: the old tree and the pool become the supply. */
    supply_old(s, &list);
    mapping_range_set t;
    mapping__rs_init(&t);
    if (m) {
        build_leaves(&t, v, m, leaves, &list, level, last);
        build_upper(&t, leaves, &list, level, last);
    }
    free(level);
    free(last);
    /* What is left is the new pool: as many spare nodes as before (a
     * caller's reservation stands), the rest back to malloc. */
    t.pool = list;
    for (mapping_rs_node *n = list; n; n = n->next)
        t.spare++;
    pool_trim(&t, keep_spare + RS_POOL_SLACK);
    *s = t;
    return MAPPING_OK;
}

/* Rebuild rather than k single operations when k is a large part of the set:
 * a walk of n intervals and a build cost about as much as n / 16 descents. */
static bool rebuild_pays(const mapping_range_set *s, size_t k)
{
    return k >= 64 && k * 16 >= s->count;
}

mapping_status mapping__rs_add_sorted(mapping_range_set *s, const mapping_range *r, size_t k)
{
    if (k == 0)
        return MAPPING_OK;
    if (!rebuild_pays(s, k)) {
        mapping_status status = mapping__rs_reserve(s, k);
        if (status != MAPPING_OK)
            return status;
        for (size_t q = 0; q < k; q++)
            mapping__rs_add(s, r[q].lo, r[q].hi); /* cannot fail: reserved */
        return MAPPING_OK;
    }
    size_t n = s->count;
    if (n == 0) { /* r is the set: merge touching neighbours in place of a copy */
        size_t m = 1;
        for (size_t q = 1; q < k; q++)
            m += r[q].lo > r[q - 1].hi;
        if (m == k)
            return rebuild(s, r, k);
    }
    mapping_range *out = mapping_os_malloc((n + k) * sizeof *out);
    if (!out)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "range set: out of memory adding %zu ranges", k);
    /* A merge of the leaves (walked in place) and r. */
    const mapping_rs_node *leaf = s->count ? s->first : NULL; /* leaves of a non-empty set are not empty */
    unsigned i = 0;
    size_t j = 0, m = 0;
    while (leaf || j < k) {
        mapping_range x;
        if (leaf && (j >= k || leaf->lo[i] <= r[j].lo)) {
            x = (mapping_range){leaf->lo[i], leaf->hi[i]};
            if (++i == leaf->n)
                leaf = leaf->next, i = 0;
        } else {
            x = r[j++];
        }
        if (m && x.lo <= out[m - 1].hi) { /* overlaps or touches the last: merge */
            if (x.hi > out[m - 1].hi)
                out[m - 1].hi = x.hi;
        } else {
            out[m++] = x;
        }
    }
    mapping_status status = rebuild(s, out, m);
    free(out);
    return status;
}

/* remove_sorted by a walk and a rebuild. */
static mapping_status remove_by_rebuild(mapping_range_set *s, const mapping_range *r, size_t k)
{
    size_t n = s->count;
    mapping_range *out = mapping_os_malloc((n + k) * sizeof *out);
    if (!out)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "range set: out of memory removing %zu ranges", k);
    size_t m = 0, j = 0;
    for (const mapping_rs_node *leaf = s->first; leaf; leaf = leaf->next) {
        for (unsigned i = 0; i < leaf->n; i++) {
            size_t lo = leaf->lo[i], hi = leaf->hi[i];
            while (j < k && r[j].hi <= lo) /* removals wholly before this interval */
                j++;
            for (size_t q = j; q < k && r[q].lo < hi && lo < hi; q++) {
                if (r[q].lo > lo)
                    out[m++] = (mapping_range){lo, r[q].lo};
                if (r[q].hi > lo)
                    lo = r[q].hi;
            }
            if (lo < hi)
                out[m++] = (mapping_range){lo, hi};
        }
    }
    mapping_status status = rebuild(s, out, m);
    free(out);
    return status;
}

/* ---- lookups ---- */

bool mapping__rs_seek(const mapping_range_set *s, size_t pos, mapping_rs_cursor *c, mapping_range *r)
{
    unsigned j;
    const mapping_rs_node *leaf = find(s, pos, &j);
    if (!leaf)
        return false;
    *c = (mapping_rs_cursor){leaf, j};
    *r = (mapping_range){leaf->lo[j], leaf->hi[j]};
    return true;
}

bool mapping__rs_next(mapping_rs_cursor *c, mapping_range *r)
{
    if (!c->leaf)
        return false;
    if (++c->i >= c->leaf->n) {
        c->leaf = c->leaf->next;
        c->i = 0;
        if (!c->leaf)
            return false;
    }
    *r = (mapping_range){c->leaf->lo[c->i], c->leaf->hi[c->i]};
    return true;
}

size_t mapping__rs_count(const mapping_range_set *s)
{
    return s->count;
}

bool mapping__rs_intersects(const mapping_range_set *s, size_t lo, size_t hi)
{
    mapping_rs_cursor c;
    mapping_range r;
    return lo < hi && mapping__rs_seek(s, lo, &c, &r) && r.lo < hi;
}

size_t mapping__rs_bytes_in(const mapping_range_set *s, size_t lo, size_t hi)
{
    if (lo >= hi || !s->root)
        return 0;
    if (lo <= s->first->lo[0] && hi >= s->last->hi[s->last->n - 1])
        return s->total;
    size_t sum = 0;
    mapping_rs_cursor c;
    mapping_range r;
    for (bool ok = mapping__rs_seek(s, lo, &c, &r); ok && r.lo < hi; ok = mapping__rs_next(&c, &r)) {
        size_t a = r.lo > lo ? r.lo : lo;
        size_t b = r.hi < hi ? r.hi : hi;
        sum += b - a;
    }
    return sum;
}

size_t mapping__rs_memory(const mapping_range_set *s)
{
    return (s->nodes + s->spare) * sizeof(mapping_rs_node);
}

/* ---- invariants, for tests ---- */

typedef struct rs_walk {
    const mapping_range_set *s;
    const mapping_rs_node   *prev_leaf;
    size_t                   prev_hi, count, total, nodes;
    bool                     any;
} rs_walk;

/* Every interval of node lies within [lo, hi] (the separators around it). */
/* A leaf: linked in order, its intervals within [lo, hi), sorted,
 * disjoint and not adjacent to the previous leaf's. */
static bool valid_leaf(rs_walk *w, const mapping_rs_node *node, size_t lo, size_t hi)
{
    const mapping_range_set *s = w->s;
    if (node->prev != w->prev_leaf || (w->prev_leaf ? w->prev_leaf->next : s->first) != node)
        return false;
    w->prev_leaf = node;
    for (unsigned i = 0; i < node->n; i++) {
        if (node->lo[i] >= node->hi[i] || node->lo[i] < lo || node->hi[i] > hi)
            return false;
        if (w->any && w->prev_hi >= node->lo[i]) /* sorted, disjoint, not adjacent */
            return false;
        w->any = true;
        w->prev_hi = node->hi[i];
        w->total += node->hi[i] - node->lo[i];
    }
    w->count += node->n;
    return true;
}

static bool valid_node(rs_walk *w, const mapping_rs_node *node, unsigned depth, size_t lo, size_t hi)
{
    bool root = depth == 0;
    if (node->n > RS_B || node->n < (root ? 1u : (unsigned)RS_MIN))
        return false;
    w->nodes++;
    if (depth + 1 == w->s->levels)
        return valid_leaf(w, node, lo, hi);
    for (unsigned i = 0; i < node->n; i++)
        if (node->sep[i] < lo || node->sep[i] > hi || (i > 0 && node->sep[i - 1] >= node->sep[i]))
            return false;
    for (unsigned i = 0; i <= node->n; i++)
        if (!valid_node(w, node->child[i], depth + 1, i > 0 ? node->sep[i - 1] : lo, i < node->n ? node->sep[i] : hi))
            return false;
    return true;
}

bool mapping__rs_valid(const mapping_range_set *s)
{
    size_t spare = 0;
    for (const mapping_rs_node *p = s->pool; p; p = p->next)
        spare++;
    if (spare != s->spare || s->levels > RS_MAX_LEVELS)
        return false;
    if (!s->root)
        return s->levels == 0 && s->count == 0 && s->total == 0 && s->nodes == 0 && !s->first && !s->last;
    rs_walk w = {.s = s};
    if (s->levels == 0 || !valid_node(&w, s->root, 0, 0, SIZE_MAX))
        return false;
    return w.prev_leaf == s->last && !s->last->next && w.count == s->count && w.total == s->total &&
           w.nodes == s->nodes;
}

void mapping__range_list_push(mapping_range_list *l, size_t lo, size_t hi)
{
    if (l->n && l->v[l->n - 1].hi == lo) {
        l->v[l->n - 1].hi = hi;
        return;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        mapping_range *v = mapping_os_realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->oom = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (mapping_range){lo, hi};
}
