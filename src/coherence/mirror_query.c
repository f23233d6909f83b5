/*
 * Questions about a mirror's state: mapping_mirror_stale_bytes (waits for
 * queued copies, so that its count is exact) and mapping_mirror_needs_sync
 * (never waits). Both see the CPU writes a tracked mirror found first, as
 * every call does.
 */
#include "coherence/mirror_api.h"
#include "coherence/mirror_mark_log.h"

static mapping_status check_side(const char *fn, mapping_side side)
{
    if (side != MAPPING_CPU && side != MAPPING_GPU)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: side %d is neither MAPPING_CPU nor MAPPING_GPU", fn,
                             (int)side);
    return MAPPING_OK;
}

size_t mapping_mirror_stale_bytes(const mapping_mirror *m, mapping_side side)
{
    static const char fn[] = "mapping_mirror_stale_bytes";
    if (mapping__mirror_check(fn, m) != MAPPING_OK || check_side(fn, side) != MAPPING_OK)
        return 0;
    mirror_state *st = m->st;
    size_t lo = m->offset, hi = lo + m->size;
    if (mapping__mirror_enter_fast(fn, st, false) != MAPPING_OK)
        return 0; /* recorded */
    if (st->queue.n)
        mapping__mirror_order(st, NULL, lo, hi, MIRROR_ACCESS);
    size_t stale = mapping__mirror_log_flush(st) == MAPPING_OK ? mapping__rs_bytes_in(&st->stale[side - 1], lo, hi)
                                                               : 0; /* out of memory, recorded */
    mapping__mirror_leave_fast(st);
    return stale;
}

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
    mapping_status status;
    if ((status = mapping__mirror_check(fn, m)) || (status = check_side(fn, side)))
        return status;
    if (!out)
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: out is NULL", fn);
    mirror_state *st = m->st;
    /* CPU writes found (a tracked mirror) and marks still in the log are
     * not in the sets yet: both become marks first, which waits for nothing
     * unless the program wrote bytes a queued copy uses. */
    if ((status = mapping__mirror_enter_fast(fn, st, false)))
        return status; /* recorded */
    if ((status = mapping__mirror_log_flush(st)) == MAPPING_OK)
        *out = stale_unqueued(st, side - 1, m->offset, m->offset + m->size);
    mapping__mirror_leave_fast(st);
    return status;
}
