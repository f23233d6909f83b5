/*
 * Unified mirrors (a feature, mirror_features.h): one allocation the CPU and
 * the device both address (host back end: plain memory; CUDA: managed
 * memory; OpenCL: SVM), so a sync moves no bytes. Its copy step is a
 * prefetch hint where the back end has one, ordered on the stream like a
 * copy, or nothing at all. The state machine is the same as for an ordinary
 * mirror, so stale_bytes still says what a sync would cover.
 */
#include "coherence/mirror_features.h"

static mapping_status unified_prefetch(mapping_stream *stream, mirror_state *st, int t, const mapping_range *ranges,
                                       size_t n, size_t *done)
{
    *done = 0;
    if (!mapping__can_prefetch(st->dev)) {
        *done = n;
        return MAPPING_OK;
    }
    for (; *done < n; ++*done) {
        const mapping_range *r = &ranges[*done];
        mapping_status status = mapping__prefetch(stream, st->gpu, r->lo, r->hi - r->lo, t == MIRROR_GPU);
        if (status != MAPPING_OK)
            return status;
    }
    return MAPPING_OK;
}

/* The NULL-stream contract (mapping.h): a blocking call comes after work on
 * the device's native queue. A unified mirror's CPU side is the device's
 * memory, and no copy on that queue orders the CPU's reads. */
static mapping_status unified_before_sync(const char *fn, mapping_stream *stream, mirror_state *st, int t, size_t lo,
                                          size_t hi)
{
    (void)fn, (void)lo, (void)hi;
    return !stream && t == MIRROR_CPU ? mapping__device_synchronize(st->dev) : MAPPING_OK;
}

static const mirror_feature unified_feature = {
    .name = "unified memory",
    .stages = MIRROR_STAGES_TO_CPU | MIRROR_STAGES_TO_GPU,
    .before_sync = unified_before_sync,
    .copy = unified_prefetch,
};

mapping_status mapping__mirror_unified_begin(mirror_state *st)
{
    void *host = NULL;
    mapping_status status = mapping__allocate_unified("mapping_mirror_create (unified)", st->dev, st->size, &st->gpu, &host);
    if (status != MAPPING_OK)
        return status; /* the caller falls back to an ordinary mirror */
    st->cpu = host;
    st->unified = true;
    mapping__mirror_add_feature(st, &unified_feature);
    return MAPPING_OK;
}
