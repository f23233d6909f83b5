/* The public marks: a side of a mirror (view) was written. */
#include "coherence/mirror_api.h"
#include "coherence/mirror_mark_log.h"

/* A family with features: its call begins and ends around the mark; a
 * GPU mark needs device bytes (residency refuses one that is not resident). */
static mapping_status mark_featured(const char *fn, mirror_state *st, int x, size_t lo, size_t hi)
{
    mapping_status status = mapping__mirror_enter(fn, st, false);
    if (status != MAPPING_OK)
        return status;
    if (x == MIRROR_CPU || (status = mapping__mirror_hook_device_use(fn, st, MIRROR_USE_MARK)) == MAPPING_OK)
        status = mapping__mirror_mark_ordered(fn, st, x, lo, hi);
    mapping__mirror_leave(st);
    return status;
}

static mapping_status mark_public(const char *fn, mapping_mirror *m, int x, size_t offset, size_t bytes)
{
    mapping_status status;
    if ((status = mapping__mirror_check(fn, m)) ||
        (status = mapping__check_range(fn, "mirror", offset, bytes, m->size)))
        return status;
    mirror_state *st = m->st;
    size_t lo = m->offset + offset, hi = lo + bytes;
    if (__builtin_expect(st->n_features != 0, 0))
        return mark_featured(fn, st, x, lo, hi);
    /* The common case: nothing queued, no feature: the log takes it. */
    if (__builtin_expect(!st->queue.n, 1) && mapping__mirror_log_append(st, x, lo, hi))
        return MAPPING_OK;
    return mapping__mirror_mark_ordered(fn, st, x, lo, hi);
}

mapping_status mapping_mirror_mark_cpu_modified(mapping_mirror *m, size_t offset, size_t bytes)
{
    return mark_public("mapping_mirror_mark_cpu_modified", m, MIRROR_CPU, offset, bytes);
}

mapping_status mapping_mirror_mark_gpu_modified(mapping_mirror *m, size_t offset, size_t bytes)
{
    return mark_public("mapping_mirror_mark_gpu_modified", m, MIRROR_GPU, offset, bytes);
}
