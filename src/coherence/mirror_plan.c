/* The plan stage of a sync (mirror_plan.h). */
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_copy.h"
#include "coherence/mirror_plan.h"
#include "coherence/mirror_queue.h"

/* Counts the ranges of stale[t] meeting [lo, hi), from cursor c0 / r0. */
static size_t count_stale(mapping_rs_cursor c, mapping_range r, bool any, size_t hi)
{
    size_t count = 0;
    for (bool ok = any; ok && r.lo < hi; ok = mapping__rs_next(&c, &r))
        count++;
    return count;
}

/* (stale[t] minus pending[t]) within [lo, hi): the exact ranges to copy, a
 * malloc'd array (NULL with *n == 0 when nothing). */
static mapping_status exact_ranges(const mirror_state *st, int t, size_t lo, size_t hi, mapping_range **out, size_t *n)
{
    const mapping_range_set *stale = &st->stale[t], *pend = &st->pending[t];
    mapping_rs_cursor c0, c, p;
    mapping_range r0 = {0, 0}, r, q;
    bool any = mapping__rs_seek(stale, lo, &c0, &r0);
    size_t count = count_stale(c0, r0, any, hi), k = 0;
    *out = NULL;
    *n = 0;
    if (!count)
        return MAPPING_OK;
    /* Each pending range can split one stale range in two. */
    mapping_range *v = mapping_os_malloc((count + mapping__rs_count(pend)) * sizeof *v);
    if (!v)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror: out of memory listing stale ranges");
    c = c0;
    r = r0;
    for (bool ok = any; ok && r.lo < hi; ok = mapping__rs_next(&c, &r)) {
        size_t a = r.lo > lo ? r.lo : lo;
        size_t b = r.hi < hi ? r.hi : hi;
        /* Subtract the pending ranges inside [a, b). */
        for (bool okp = mapping__rs_seek(pend, a, &p, &q); okp && q.lo < b && a < b; okp = mapping__rs_next(&p, &q)) {
            if (q.lo > a)
                v[k++] = (mapping_range){a, q.lo};
            a = q.hi;
        }
        if (a < b)
            v[k++] = (mapping_range){a, b};
    }
    if (k == 0) { /* everything stale here is already queued */
        free(v);
        v = NULL;
    }
    *out = v;
    *n = k;
    return MAPPING_OK;
}

/* For separate copies, what one more transfer costs (latency x bandwidth of
 * the measured link); for ranges that will go through a batch, a table
 * entry's worth. */
size_t mapping__mirror_merge_gap_limit(const mirror_state *st, size_t n, const mapping_link *link)
{
    if (mapping__mirror_use_batch(st, n, link))
        return MIRROR_BATCH_MERGE_GAP;
    double bytes = link->bandwidth > 0 ? link->latency * link->bandwidth : 0;
    if (!(bytes > 0))
        return 0;
    if (bytes >= (double)SIZE_MAX)
        return SIZE_MAX;
    size_t limit = (size_t)bytes; /* a gap merges when gap < bytes: gap < ceil(bytes) */
    return limit + ((double)limit < bytes);
}

size_t mapping__mirror_merge(const mirror_state *st, int s, mapping_range *v, size_t n)
{
    mapping_link link = {0, 0};
    if (n < 2)
        return n;
    if (mapping__device_link(st->dev, &link) != MAPPING_OK)
        link = (mapping_link){0, 0}; /* unmeasurable: no merging */
    size_t limit = mapping__mirror_merge_gap_limit(st, n, &link), k = 0;
    for (size_t i = 0, hi; i < n; k++) {
        size_t next = mapping__mirror_merge_run(st, s, v, n, i, limit, &hi);
        v[k] = (mapping_range){v[i].lo, hi}; /* k <= i: the run was read first */
        i = next;
    }
    return k;
}

static size_t bytes_of(const mapping_range *v, size_t n)
{
    size_t bytes = 0;
    for (size_t k = 0; k < n; k++)
        bytes += v[k].hi - v[k].lo;
    return bytes;
}

mapping_status mapping__mirror_plan_make(const char *fn, mapping_stream *stream, mirror_state *st, int t, size_t lo,
                                         size_t hi, sync_plan *p)
{
    mapping_status status;
    *p = (sync_plan){.target = t};
    if ((status = exact_ranges(st, t, lo, hi, &p->exact, &p->n_exact)) || p->n_exact == 0)
        return status;
    p->merged = mapping_os_malloc(p->n_exact * sizeof *p->merged);
    if (!p->merged)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    if (stream && ((status = mapping__mirror_queue_reserve(&st->queue)) ||
                   (status = mapping__rs_reserve(&st->pending[t], p->n_exact))))
        return status;
    memcpy(p->merged, p->exact, p->n_exact * sizeof *p->merged);
    p->n_merged = mapping__mirror_merge(st, 1 - t, p->merged, p->n_exact);
    p->moved = bytes_of(p->merged, p->n_merged);
    return MAPPING_OK;
}

void mapping__mirror_plan_refine(const mirror_state *st, sync_plan *p, mapping_range *list, size_t n)
{
    if (n)
        n = mapping__mirror_merge(st, 1 - p->target, list, n);
    free(p->merged);
    p->merged = list;
    p->n_merged = n;
    p->moved = bytes_of(list, n);
    p->refined = true;
}

void mapping__mirror_plan_free(sync_plan *p)
{
    free(p->exact);
    free(p->merged);
    p->exact = p->merged = NULL;
}
