/*
 * Questions about a mirror's state that never wait: mapping_mirror_needs_sync.
 * (mapping_mirror_stale_bytes, in mirror.c, waits for queued copies so that
 * its byte count is exact.)
 */
#include "coherence/mirror_internal.h"

/* Does [lo, hi) hold a byte stale on side t that no queued copy to t covers?
 * pending[t] is within stale[t], so a stale piece is covered exactly when
 * pending[t] holds all of its bytes. */
static bool stale_unqueued(const mirror_state *st, int t, size_t lo, size_t hi)
{
    const mapping_range_set *stale = &st->stale[t], *pending = &st->pending[t];
    if (!pending->count)
        return mapping__rs_intersects(stale, lo, hi);
    mapping_rs_cursor c;
    mapping_range r;
    for (bool more = mapping__rs_seek(stale, lo, &c, &r); more && r.lo < hi; more = mapping__rs_next(&c, &r)) {
        size_t a = r.lo > lo ? r.lo : lo, b = r.hi < hi ? r.hi : hi;
        if (mapping__rs_bytes_in(pending, a, b) != b - a)
            return true;
    }
    return false;
}

mapping_status mapping_mirror_needs_sync(const mapping_mirror *m, mapping_side side, int *out)
{
    static const char fn[] = "mapping_mirror_needs_sync";
    if (out)
        *out = 0;
    mapping_status status = mapping__mirror_check(fn, m);
    if (status != MAPPING_OK)
        return status;
    if (side != MAPPING_CPU && side != MAPPING_GPU)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: side %d is neither MAPPING_CPU nor MAPPING_GPU", fn,
                             (int)side);
    if (!out)
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: out is NULL", fn);
    mirror_state *st = m->st;
    /* CPU pages written since the last look (a tracked mirror) and marks
     * still in the log are not in the sets yet: both become marks first, as
     * a sync makes them, which waits for nothing. */
    if ((status = mapping__mirror_track_collect(fn, st, false)) || (status = mapping__mirror_log_flush(st)))
        return status; /* recorded */
    *out = stale_unqueued(st, side - 1, m->offset, m->offset + m->size);
    return MAPPING_OK;
}
