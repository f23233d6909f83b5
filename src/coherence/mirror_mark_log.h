/*
 * The mark log (mirror_mark_log.c): marks that need no check (nothing
 * queued, nothing modified on the other side, the log of one side) are
 * appended to an array in a few ns and applied to the range sets at the
 * next flush, which every reader and writer of the sets calls first.
 */
#ifndef MAPPING_MIRROR_MARK_LOG_H
#define MAPPING_MIRROR_MARK_LOG_H

#include "coherence/mirror_state.h"

/* The log is compacted from this many marks on (see mirror_mark_log.c). */
enum { MIRROR_LOG_MIN_COMPACT = 1 << 17 };
bool mapping__mirror_log_append_slow(mirror_state *st, int x, size_t lo, size_t hi);
/* Appends a mark of side x over [lo, hi) to the log when that is exact: no
 * queued work to order, no modification of the other side to conflict with,
 * and the log holds marks of x only. False: mark the slow way. Inline for
 * the common cases (a mark apart from the previous one, or extending it
 * upwards, with room and no compaction due); the rest in
 * mirror_mark_log.c. */
static inline bool mapping__mirror_log_append(mirror_state *st, int x, size_t lo, size_t hi)
{
    mirror_log *l = &st->log;
    if (st->queue.n || st->modified[1 - x].count || (l->n && l->side != x))
        return false;
    size_t n = l->n;
    if (n && n < l->cap && !(n >= MIRROR_LOG_MIN_COMPACT && n >= 2 * l->sorted)) {
        mapping_range *last = &l->v[n - 1];
        if (lo > last->hi || hi < last->lo) { /* apart from the previous mark */
            if (lo < last->lo)
                l->unsorted = true;
            l->v[n] = (mapping_range){lo, hi};
            l->n = n + 1;
            return true;
        }
        if (lo >= last->lo) { /* touches it, from its start on: one range */
            if (hi > last->hi)
                last->hi = hi;
            return true;
        }
    }
    return mapping__mirror_log_append_slow(st, x, lo, hi);
}
/* Sorts the log by lo and merges ranges that overlap or touch (its tail
 * only, then merged with the part already sorted); the log and its scratch
 * may swap. Out of memory: nothing changes. */
mapping_status mapping__mirror_log_sort(mirror_state *st);
/* Applies the logged marks to the range sets (sorted and merged first). */
mapping_status mapping__mirror_log_apply(mirror_state *st);
static inline mapping_status mapping__mirror_log_flush(mirror_state *st)
{
    return st->log.n ? mapping__mirror_log_apply(st) : MAPPING_OK;
}
void           mapping__mirror_log_free(mirror_state *st);

#endif
