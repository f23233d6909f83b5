/*
 * A set of byte ranges: disjoint, non-adjacent half-open intervals [lo, hi).
 * A mirror keeps a few per side (stale, modified, in flight).
 *
 * Why a B+ tree with small node arrays: marking must stay O(log n) in the
 * number of ranges however many a mirror accumulates (the sorted array used
 * before moved its tail on every insertion: O(n), a millisecond per mark at
 * a million ranges). Leaves hold up to 32 intervals in plain arrays (a
 * binary search over a few cache lines, all requested at once), internal
 * nodes up to 32 separators, so a million ranges are 4 levels deep and a
 * lookup misses the cache a few times, where a balanced binary tree would
 * chase ~20 pointers and allocate per range. Leaves are linked both ways, so
 * walking k neighbours costs O(k), not k descents. Every node but the root
 * is at least half full (a full leaf that is appended to first shares with
 * its sibling, so ranges marked in order fill leaves almost completely) and
 * nodes are freed as the set shrinks, so memory stays proportional to the
 * number of distinct ranges: at most ~36 bytes per range (536-byte nodes),
 * typically ~25, never a bitmap of the buffer. Costs: lookups O(log n);
 * add/remove of one interval O(log n + k) for the k intervals it merges or
 * deletes (a leaf's run goes at once; amortized O(log n), as each interval
 * is deleted once); the byte total is O(1).
 *
 * A separator between two subtrees is a position in the gap between them
 * (every interval on its left ends at or before it, every one on its right
 * starts at or after it), not a copy of a key: intervals can then shrink,
 * split and be trimmed without touching any separator, and an interval that
 * grows only moves the separators on its own path.
 *
 * Failure atomicity: only an operation that creates an interval (an add that
 * touches nothing, a remove that splits one in two) can need a node. Nodes
 * come from a per-set pool that mapping__rs_reserve fills: callers that
 * change several sets as one step reserve first, after which add/remove
 * cannot fail. Without a reservation, add/remove fail (out of memory) before
 * changing anything.
 */
#ifndef MAPPING_RANGE_SET_H
#define MAPPING_RANGE_SET_H

#include <stdbool.h>
#include <stddef.h>
#include "core/core.h" /* mapping_range */
#include "mapping.h"

typedef struct mapping_rs_node mapping_rs_node; /* private to range_set.c */

typedef struct mapping_range_set {
    mapping_rs_node *root;        /* NULL when the set is empty */
    mapping_rs_node *first, *last; /* the leaves at both ends */
    mapping_rs_node *pool;        /* spare nodes (see mapping__rs_reserve) */
    unsigned         levels;      /* 0 when empty; 1 when the root is a leaf */
    size_t           count;       /* intervals */
    size_t           nodes, spare; /* nodes in the tree, in the pool */
    size_t           total;       /* sum of hi - lo: O(1) byte count of the whole set */
} mapping_range_set;

/* A position in a set: valid until the set next changes. */
typedef struct mapping_rs_cursor {
    const mapping_rs_node *leaf;
    unsigned               i;
} mapping_rs_cursor;

void mapping__rs_init(mapping_range_set *s);
void mapping__rs_free(mapping_range_set *s);
/* Makes sure the next add/remove calls that create at most `extra` intervals
 * in all cannot fail; the only call here that can fail. Each call replaces
 * the previous reservation (it hands surplus spare nodes back to malloc). */
mapping_status mapping__rs_reserve(mapping_range_set *s, size_t extra);
/* Union with [lo, hi). Creates at most one interval. */
mapping_status mapping__rs_add(mapping_range_set *s, size_t lo, size_t hi);
/* Difference with [lo, hi). Creates at most one interval (a split). */
mapping_status mapping__rs_remove(mapping_range_set *s, size_t lo, size_t hi);
/* Difference with each of r[0..k) (sorted by lo, disjoint): k removals,
 * O(k log n + intervals deleted), or a walk and rebuild, O(n + k), when k
 * is a large part of the set. All or nothing (it reserves for the splits
 * it will make first); replaces any earlier reservation. */
mapping_status mapping__rs_remove_sorted(mapping_range_set *s, const mapping_range *r, size_t k);
/* Union with each of r[0..k) (sorted by lo, disjoint): k insertions, or
 * when k is a large part of the set one O(n + k) walk and rebuild. All or
 * nothing; replaces any earlier reservation. */
mapping_status mapping__rs_add_sorted(mapping_range_set *s, const mapping_range *r, size_t k);

/* The first interval with hi > pos into *r, and a cursor on it; false (and
 * *r untouched) if there is none. O(log n). */
bool mapping__rs_seek(const mapping_range_set *s, size_t pos, mapping_rs_cursor *c, mapping_range *r);
/* Moves c to the next interval, into *r; false at the end. O(1). */
bool mapping__rs_next(mapping_rs_cursor *c, mapping_range *r);
/* Number of intervals. O(1). */
size_t mapping__rs_count(const mapping_range_set *s);
/* Does any interval meet [lo, hi)? O(log n). */
bool mapping__rs_intersects(const mapping_range_set *s, size_t lo, size_t hi);
/* Bytes of the set inside [lo, hi). O(log n + intervals inside); O(1) when
 * [lo, hi) covers the whole set. */
size_t mapping__rs_bytes_in(const mapping_range_set *s, size_t lo, size_t hi);
/* Bytes of memory the set holds (tree and spare nodes). O(1). */
size_t mapping__rs_memory(const mapping_range_set *s);
/* Checks every invariant (order, gaps, separators, fill, links, counts,
 * total); O(n), for tests. */
bool mapping__rs_valid(const mapping_range_set *s);

/* A growable array of ranges (what a write-tracking collect found, before
 * it becomes marks): free v when done. */
typedef struct mapping_range_list {
    mapping_range *v;
    size_t         n, cap;
    bool           oom; /* a push found no memory (that range is missing) */
} mapping_range_list;
/* Appends [lo, hi), joined to the last range when they touch. */
void mapping__range_list_push(mapping_range_list *l, size_t lo, size_t hi);

#endif
