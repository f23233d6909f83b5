/*
 * A set of byte ranges: disjoint, non-adjacent half-open intervals [lo, hi)
 * kept in one sorted array. A mirror keeps a few per side (stale, modified,
 * in flight).
 *
 * Why a sorted array rather than a balanced tree: lookups are a binary search
 * (O(log n)); an insertion or removal moves the tail of the array with one
 * memmove of 16-byte entries, which for the few thousand ranges a mirror
 * realistically holds costs less than a single transfer and far less than a
 * tree's pointer chasing and per-node allocations. Memory is exactly one
 * entry per distinct range (plus slack from doubling), never a bitmap of the
 * buffer.
 *
 * Failure atomicity: add/remove of one interval grows the array by at most one
 * entry. Callers that change several sets as one step reserve that space
 * first (mapping__rs_reserve), after which add/remove cannot fail.
 */
#ifndef MAPPING_RANGE_SET_H
#define MAPPING_RANGE_SET_H

#include <stdbool.h>
#include <stddef.h>
#include "mapping.h"

typedef struct mapping_range {
    size_t lo, hi; /* [lo, hi), lo < hi */
} mapping_range;

typedef struct mapping_range_set {
    mapping_range *v;
    size_t         n, cap;
    size_t         total; /* sum of hi - lo: O(1) byte count of the whole set */
} mapping_range_set;

void mapping__rs_init(mapping_range_set *s);
void mapping__rs_free(mapping_range_set *s);
/* Makes room for `extra` more entries; the only call here that can fail. */
mapping_status mapping__rs_reserve(mapping_range_set *s, size_t extra);
/* Union with [lo, hi). Grows by at most one entry. */
mapping_status mapping__rs_add(mapping_range_set *s, size_t lo, size_t hi);
/* Difference with [lo, hi). Grows by at most one entry (a split). */
mapping_status mapping__rs_remove(mapping_range_set *s, size_t lo, size_t hi);
/* Difference with each of r[0..k) (sorted by lo, disjoint), in one linear
 * pass: O(n + k) instead of k memmoves. All or nothing (it allocates the
 * result first). */
mapping_status mapping__rs_remove_sorted(mapping_range_set *s, const mapping_range *r, size_t k);
/* Index of the first interval with hi > pos (n if none). O(log n). */
size_t mapping__rs_lower(const mapping_range_set *s, size_t pos);
/* Does any interval meet [lo, hi)? O(log n). */
bool mapping__rs_intersects(const mapping_range_set *s, size_t lo, size_t hi);
/* Bytes of the set inside [lo, hi). O(log n + intervals inside). */
size_t mapping__rs_bytes_in(const mapping_range_set *s, size_t lo, size_t hi);
/* Checks the invariants (sorted, disjoint, non-adjacent, total); for tests. */
bool mapping__rs_valid(const mapping_range_set *s);

#endif
