/*
 * Unified mirrors: one allocation the CPU and the device both address (host
 * back end: plain memory; CUDA: managed memory; OpenCL: SVM), so a sync moves
 * no bytes. It becomes a prefetch hint where the back end has one, ordered on
 * the stream like a copy, or nothing at all. The state machine is the same as
 * for an ordinary mirror, so stale_bytes still says what a sync would cover.
 */
#include "coherence/mirror_internal.h"

mapping_status mapping__mirror_alloc_unified(mirror_state *st)
{
    void *host = NULL;
    mapping_status status = mapping__allocate_unified("mapping_mirror_create (unified)", st->dev, st->size, &st->gpu, &host);
    if (status != MAPPING_OK)
        return status; /* the caller falls back to an ordinary mirror */
    st->cpu = host;
    st->unified = true;
    return MAPPING_OK;
}

mapping_status mapping__mirror_prefetch(mapping_stream *stream, mirror_state *st, int target,
                                        const mapping_range *ranges, size_t n, size_t *done)
{
    mapping_device *dev = st->dev;
    *done = 0;
    if (!mapping__can_prefetch(dev)) {
        *done = n;
        return MAPPING_OK;
    }
    for (; *done < n; ++*done) {
        const mapping_range *r = &ranges[*done];
        mapping_status status = mapping__prefetch(stream, st->gpu, r->lo, r->hi - r->lo, target == MIRROR_GPU);
        if (status != MAPPING_OK)
            return status;
    }
    return MAPPING_OK;
}
