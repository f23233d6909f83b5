/* The public marks: a side of a mirror (view) was written. */
#include "coherence/mirror_api.h"
#include "coherence/mirror_mark_log.h"

static mapping_status mark_public(const char *fn, mapping_mirror *m, int x, size_t offset, size_t bytes)
{
    mapping_status status;
    if ((status = mapping__mirror_check(fn, m)) ||
        (status = mapping__check_range(fn, "mirror", offset, bytes, m->size)) ||
        (status = mapping__mirror_enter_fast(fn, m->st, false)))
        return status;
    mirror_state *st = m->st;
    size_t lo = m->offset + offset, hi = lo + bytes;
    /* The common case: nothing queued, no feature: the log takes it. */
    if (__builtin_expect(!st->queue.n && !st->n_features, 1) && mapping__mirror_log_append(st, x, lo, hi))
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
