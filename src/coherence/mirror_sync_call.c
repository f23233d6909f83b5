/*
 * The public syncs (mapping_mirror_sync_to_gpu / _cpu): the handle checked
 * once; on a stream being captured into a CUDA graph, a graph sync
 * (mirror_graph.c); else the stages (mirror_sync.c), a family with features
 * beginning and ending its call around them (mapping__mirror_enter, _leave).
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

/* A back end with graphs: on a stream being captured the sync is recorded
 * in the graph (*recorded; mirror_graph.c: each replay moves what is stale
 * then); otherwise the refusals of a capture (a blocking sync while a
 * blocking stream is captured, an invalidated capture). */
static __attribute__((noinline)) mapping_status sync_captured(const char *fn, mapping_stream *stream,
                                                              mapping_mirror *m, int t, bool *recorded)
{
    mapping_device *dev = m->st->dev;
    if (!stream || !mapping__can_graph_copy(dev))
        return mapping__mirror_refuse_capture(fn, dev, stream);
    int capture = MAPPING_CAPTURE_NONE;
    mapping_status status = mapping__stream_capture_status(dev, stream, &capture, NULL);
    if (status || capture == MAPPING_CAPTURE_NONE)
        return status;
    if (capture != MAPPING_CAPTURE_ACTIVE)
        return mapping__mirror_refuse_capture(fn, dev, stream);
    *recorded = true;
    return mapping__mirror_graph_sync(fn, stream, m, t, 0);
}

static mapping_status sync_public(const char *fn, mapping_stream *stream, mapping_mirror *m, int t)
{
    mapping_status status;
    bool recorded = false;
    if ((status = mapping__mirror_check(fn, m)) || (status = mapping__check_stream(fn, stream)) ||
        (status = mapping__check_same_device(fn, m->st->dev, stream)))
        return status;
    if (__builtin_expect(mapping__can_capture(m->st->dev), 0) &&
        ((status = sync_captured(fn, stream, m, t, &recorded)) || recorded))
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
