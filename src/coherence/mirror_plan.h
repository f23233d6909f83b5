/*
 * The plan stage of a sync (mirror_plan.c): which ranges are stale on the
 * target and not already queued (the exact ranges, which become valid), and
 * which neighbours to merge into one copy, by the device's measured link.
 */
#ifndef MAPPING_MIRROR_PLAN_H
#define MAPPING_MIRROR_PLAN_H

#include "coherence/mirror_state.h"

/* The smallest gap not worth copying to save one range, in bytes (0: no
 * gap is), for a list of n ranges on this link. */
size_t mapping__mirror_merge_gap_limit(const mirror_state *st, size_t n, const mapping_link *link);
/* The run of v[i] and the neighbours after it that merge into one copy:
 * each gap below `limit` bytes and valid on the source s (copying a gap
 * must never carry stale source bytes over valid target bytes). Returns the
 * index after the run; *hi is its end. Inline: the log's fast path calls it
 * once per marked range. */
static inline size_t mapping__mirror_merge_run(const mirror_state *st, int s, const mapping_range *v, size_t n,
                                               size_t i, size_t limit, size_t *hi)
{
    bool any_stale = st->stale[s].count != 0; /* else every gap is valid on the source */
    size_t end = v[i].hi;
    for (i++; i < n && v[i].lo - end < limit && !(any_stale && mapping__rs_intersects(&st->stale[s], end, v[i].lo));
         i++)
        end = v[i].hi;
    *hi = end;
    return i;
}
/* Merges v[0..n) in place by the link (source s); returns the count. */
size_t mapping__mirror_merge(const mirror_state *st, int s, mapping_range *v, size_t n);

/* Fills p for a sync of [lo, hi) to t; p->n_exact == 0 when everything
 * stale is already queued. With a stream, reserves room for the queued
 * entry and the pending ranges. */
mapping_status mapping__mirror_plan_make(const char *fn, mapping_stream *stream, mirror_state *st, int t, size_t lo,
                                         size_t hi, sync_plan *p);
/* Replaces what the plan copies with list[0..n) (malloc'd, sorted,
 * disjoint, within the exact ranges), merged by the link: a refinement. */
void           mapping__mirror_plan_refine(const mirror_state *st, sync_plan *p, mapping_range *list, size_t n);
void           mapping__mirror_plan_free(sync_plan *p);

#endif
