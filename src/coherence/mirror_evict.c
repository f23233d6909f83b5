/*
 * The public calls of residency (mirror_resident.c): evict a family's
 * device side now, and hint how the memory budget should treat it. A
 * family without the feature (its device had no budget when it was made)
 * gets it here, inside the call.
 */
#include "coherence/mirror_api.h"
#include "coherence/mirror_features.h"

/* Unified and adopted mirrors are never evicted: the one allocation is
 * both sides, or the device memory is the caller's. */
static mapping_status check_evictable(const char *fn, const mirror_state *st)
{
    if (st->unified || st->borrowed_gpu)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: a %s mirror is never evicted (%s)", fn, st->unified ? "unified" : "adopted",
                             st->unified ? "one allocation serves both sides" : "its device memory is the caller's");
    return MAPPING_OK;
}

/* Enters a call on the family, with residency (begun here if need be). */
static mapping_status enter_resident(const char *fn, mapping_mirror *m)
{
    mapping_status status = mapping__mirror_check(fn, m);
    if (status)
        return status;
    mirror_state *st = m->st;
    if ((status = check_evictable(fn, st)) || (status = mapping__mirror_enter_fast(fn, st, false)))
        return status;
    if (st->resident)
        return MAPPING_OK;
    /* Begun inside this call: it takes the family's lock, which the leave drops. */
    if ((status = mapping__mirror_resident_begin(fn, st, true)) != MAPPING_OK)
        mapping__mirror_leave_fast(st);
    return status;
}

mapping_status mapping_mirror_evict(mapping_mirror *m)
{
    static const char fn[] = "mapping_mirror_evict";
    mapping_status status = enter_resident(fn, m);
    if (status != MAPPING_OK)
        return status;
    status = mapping__mirror_resident_evict(fn, m->st);
    mapping__mirror_leave(m->st);
    return status;
}

mapping_status mapping_mirror_set_residency(mapping_mirror *m, mapping_residency hint)
{
    static const char fn[] = "mapping_mirror_set_residency";
    if ((unsigned)hint > MAPPING_RESIDENCY_EVICT_FIRST) {
        mapping_status status = mapping__mirror_check(fn, m);
        return status ? status
                      : mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                                      "%s: hint %d is not MAPPING_RESIDENCY_DEFAULT, _KEEP or _EVICT_FIRST", fn,
                                      (int)hint);
    }
    mapping_status status = enter_resident(fn, m);
    if (status != MAPPING_OK)
        return status;
    mapping__mirror_resident_hint(m->st, hint);
    mapping__mirror_leave(m->st);
    return MAPPING_OK;
}
