/* The handle check every public mirror call makes once (mirror_api.h). */
#include "coherence/mirror_api.h"
#include "coherence/mirror_features.h"

_Thread_local MAPPING_TLS_FAST mapping_live_memo mapping__mirror_check_memo;

/* A family made before its device had a memory budget takes part from its
 * next call on: setting a budget moves the removal count
 * (core/budget.c), which sends every family's next check here. Where it
 * cannot (out of memory) it is simply never evicted. */
static void join_budget(const char *fn, mirror_state *st)
{
    if (st->resident || st->unified || st->borrowed_gpu || !atomic_load(&st->dev->budget))
        return;
    mapping_error_mark before;
    mapping__error_mark(&before);
    mapping__mirror_resident_begin(fn, st, false);
    mapping__error_forget(&before);
}

mapping_status mapping__mirror_check_failed(const char *fn, const mapping_mirror *m, uint64_t removals)
{
    if (!m)
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: mirror is NULL", fn);
    if (!mapping__handle_live_memo(&mapping__mirror_check_memo, MAPPING_HANDLE_MIRROR, m, removals))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: mirror %p is not a live mirror", fn, (const void *)m);
    if (removals != m->st->dev_checked_removals) {
        if (!mapping__device_alive(m->st->dev, m->st->dev_serial))
            return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: the device of mirror %p was closed before it", fn,
                                 (const void *)m);
        m->st->dev_checked_removals = removals;
        if (!m->st->busy)
            join_budget(fn, m->st);
    }
    if (m->st->busy)
        return mapping__fail(MAPPING_ERR_BUSY, "%s: mirror %p's family is being synced (called from a callback of "
                                               "that sync)", fn, (const void *)m);
    return MAPPING_OK;
}
