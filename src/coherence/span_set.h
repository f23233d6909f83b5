/*
 * A small set of byte ranges for mirrors with several device sides
 * (multimirror.c): a sorted array of disjoint, non-touching [start, end)
 * spans. Adding and removing cost O(n) (one memmove); lookups O(log n).
 * Kept apart from range_set.{c,h} (the two-sided mirrors' B+ tree) so the
 * two evolve independently.
 */
#ifndef MAPPING_SPAN_SET_H
#define MAPPING_SPAN_SET_H

#include <stdbool.h>
#include <stddef.h>

typedef struct mapping_span {
    size_t start, end;
} mapping_span;

typedef struct mapping_span_set {
    mapping_span *v;
    size_t        n, cap;
    size_t        bytes; /* total */
} mapping_span_set;

void mapping__span_set_free(mapping_span_set *s);
/* Room for `extra` more spans: one add or remove then needs at most one
 * more and cannot fail (callers reserve first to stay all-or-nothing).
 * false: out of host memory (the set is unchanged). */
bool mapping__span_set_reserve(mapping_span_set *s, size_t extra);
/* false: out of host memory (the set is unchanged). */
bool mapping__span_set_add(mapping_span_set *s, size_t start, size_t end);
bool mapping__span_set_remove(mapping_span_set *s, size_t start, size_t end);
bool mapping__span_set_intersects(const mapping_span_set *s, size_t start, size_t end);
/* Calls fn for each part of [start, end) inside the set, in order; stops
 * (returning false) when fn does. */
bool mapping__span_set_each_in(const mapping_span_set *s, size_t start, size_t end,
                               bool (*fn)(size_t start, size_t end, void *user), void *user);
/* Index of the first span that ends after pos (s->n if none). O(log n). */
size_t mapping__span_set_first_after(const mapping_span_set *s, size_t pos);
/* Bytes of [start, end) inside the set. */
size_t mapping__span_set_bytes_in(const mapping_span_set *s, size_t start, size_t end);

#endif
