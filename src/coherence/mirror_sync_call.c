/*
 * The public syncs (mapping_mirror_sync_to_gpu / _cpu): the handle checked
 * once, then the stages (mirror_sync.c); a family with features begins and
 * ends its call around them (mapping__mirror_enter, _leave).
 */
#include "coherence/mirror_api.h"

/* A family with features: its call begins and ends around the sync. */
static mapping_status sync_featured(const char *fn, mapping_stream *stream, mapping_mirror *m, int t)
{
    mapping_status status = mapping__mirror_enter(fn, m->st, t == MIRROR_GPU);
    if (status != MAPPING_OK)
        return status;
    status = mapping__mirror_sync_checked(fn, stream, m, t);
    mapping__mirror_leave(m->st);
    return status;
}

static mapping_status sync_public(const char *fn, mapping_stream *stream, mapping_mirror *m, int t)
{
    mapping_status status;
    if ((status = mapping__mirror_check(fn, m)) || (status = mapping__check_stream(fn, stream)) ||
        (status = mapping__check_same_device(fn, m->st->dev, stream)))
        return status;
    if (__builtin_expect(m->st->n_features == 0, 1))
        return mapping__mirror_sync_checked(fn, stream, m, t);
    return sync_featured(fn, stream, m, t);
}

mapping_status mapping_mirror_sync_to_gpu(mapping_stream *stream, mapping_mirror *m)
{
    return sync_public("mapping_mirror_sync_to_gpu", stream, m, MIRROR_GPU);
}

mapping_status mapping_mirror_sync_to_cpu(mapping_stream *stream, mapping_mirror *m)
{
    return sync_public("mapping_mirror_sync_to_cpu", stream, m, MIRROR_CPU);
}
