/*
 * Stream capture (CUDA graphs) at the public boundary. Work queued on a
 * stream that is being captured does not run: it becomes graph nodes, run
 * at each replay (cudaGraphLaunch). So each public call that takes or uses
 * a stream asks the back end (mapping_backend.stream_capture_status: one
 * driver query on CUDA, nothing elsewhere) and either lets the call record
 * correct nodes, or refuses it with MAPPING_ERR_UNSUPPORTED naming the call
 * and the capture, before anything is queued: never a capture invalidated
 * behind the caller's back (a synchronize, an event query), never a graph
 * that replays the bytes of capture time (pageable memory staged at the
 * call), never the library's bookkeeping done once at capture instead of at
 * each replay. docs/cuda.md has the table of calls and which way each goes.
 *
 * A blocking call (stream NULL) is never captured: it runs now, on the queue
 * of blocking calls (CUDA: the legacy default stream). It is refused while
 * work there would depend on a capture (MAPPING_CAPTURE_IMPLICIT: a stream
 * created without CU_STREAM_NON_BLOCKING is capturing), which would
 * invalidate it. Captures of non-blocking streams, on this thread or any
 * other, in any capture mode, are left alone: the CUDA back end makes its
 * driver calls in CU_STREAM_CAPTURE_MODE_RELAXED (cuda_device.h).
 */
#include "core/ops.h"
#include "track/race_guard.h"

static mapping_status refuse(const char *fn, const mapping_stream *stream, int status, const char *why)
{
    if (status == MAPPING_CAPTURE_IMPLICIT)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: a blocking call (stream NULL) runs on the device's native queue (CUDA: the legacy "
                             "default stream), and a stream that synchronizes with it (created without "
                             "CU_STREAM_NON_BLOCKING) is being captured into a CUDA graph: the call would invalidate "
                             "that capture; call it on a stream, or after the capture",
                             fn);
    if (status == MAPPING_CAPTURE_INVALIDATED)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: stream %p belongs to a capture into a CUDA graph that has been invalidated: end "
                             "the capture (cuStreamEndCapture) before using the stream",
                             fn, (const void *)stream);
    return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                         "%s: stream %p is being captured into a CUDA graph (stream capture), and this call cannot be "
                         "captured: %s; call it outside the capture",
                         fn, (const void *)stream, why);
}

static bool race_check(const mapping_device *dev)
{
    return atomic_load_explicit(&dev->checks, memory_order_relaxed) || mapping__race_check_on();
}

mapping_status mapping__stream_refuse_capture_why(mapping_device *dev, mapping_stream *stream, const char *fn,
                                                  const char *why)
{
    int status = MAPPING_CAPTURE_NONE;
    mapping_status st = mapping__stream_capture_status(dev, stream, &status, NULL);
    if (st != MAPPING_OK || status == MAPPING_CAPTURE_NONE)
        return st;
    return refuse(fn, stream, status, why);
}

mapping_status mapping__stream_refuse_capture(mapping_device *dev, mapping_stream *stream, const char *fn)
{
    return mapping__stream_refuse_capture_why(dev, stream, fn,
                                              "it would wait for work of the stream, or do its work (and the "
                                              "library's bookkeeping) once now rather than at each replay");
}

mapping_status mapping__capture_check_queued(const char *fn, mapping_device *dev, mapping_stream *stream,
                                             bool host_function, uint64_t *id)
{
    int status = MAPPING_CAPTURE_NONE;
    mapping_status st = mapping__stream_capture_status(dev, stream, &status, id);
    if (st != MAPPING_OK || status == MAPPING_CAPTURE_NONE)
        return st;
    if (status != MAPPING_CAPTURE_ACTIVE)
        return refuse(fn, stream, status, "");
    if (!(host_function && race_check(dev)))
        return MAPPING_OK; /* recorded as a node, run at each replay */
    return refuse(fn, stream, status,
                  "MAPPING_CHECK=races (or mapping_device_set_checks) follows host functions with bookkeeping "
                  "of its own, which a replay would repeat");
}

mapping_status mapping__capture_check_copy(const char *fn, mapping_device *dev, mapping_stream *stream,
                                           const void *host, size_t bytes)
{
    int status = MAPPING_CAPTURE_NONE;
    mapping_status st = mapping__stream_capture_status(dev, stream, &status, NULL);
    if (st != MAPPING_OK || status == MAPPING_CAPTURE_NONE)
        return st;
    if (status != MAPPING_CAPTURE_ACTIVE)
        return refuse(fn, stream, status, "");
    if (race_check(dev))
        return refuse(fn, stream, status,
                      "MAPPING_CHECK=races (or mapping_device_set_checks) follows each copy with host functions "
                      "of its own, which a replay would repeat");
    if (mapping__host_cache_holds(dev, host, bytes))
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: stream %p is being captured into a CUDA graph, and the host memory at %p (%zu bytes) "
                             "is registered by mapping_device_set_host_registration, which may unregister it before "
                             "a replay; use page-locked memory, or copy outside the capture",
                             fn, (const void *)stream, host, bytes);
    mapping_host_ref ref;
    if (mapping__host_registry_find(&dev->host_blocks, host, bytes, &ref) ||
        mapping__host_locked_elsewhere(dev, host, bytes))
        return MAPPING_OK; /* a copy node: it reads (or writes) the host memory at each replay */
    return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                         "%s: stream %p is being captured into a CUDA graph, and the host memory at %p (%zu bytes) is "
                         "pageable: its copy goes through page-locked staging now, at capture, so every replay "
                         "would move the bytes of capture time; use page-locked memory (mapping_allocate_cpu, "
                         "a MAPPING_MIRROR_PIN mirror's, memory pinned by CUDA or torch), or copy outside the capture",
                         fn, (const void *)stream, host, bytes);
}

mapping_status mapping__capture_check_event(const char *fn, const mapping_event *event)
{
    if (!event->capture)
        return MAPPING_OK;
    return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                         "%s: event %p was recorded while its stream was being captured into a CUDA graph: it marks "
                         "a point of the graph, not of the stream's execution, and never completes by itself; only "
                         "another stream of the same capture may wait for it (mapping_stream_wait_event)",
                         fn, (const void *)event);
}

mapping_status mapping__capture_check_wait(const char *fn, mapping_stream *stream, const mapping_event *event)
{
    int status = MAPPING_CAPTURE_NONE, event_status = MAPPING_CAPTURE_NONE;
    uint64_t id = 0, event_id = 0;
    mapping_status st = mapping__stream_capture_status(stream->dev, stream, &status, &id);
    if (st != MAPPING_OK)
        return st;
    if (status != MAPPING_CAPTURE_NONE && status != MAPPING_CAPTURE_ACTIVE)
        return refuse(fn, stream, status, "");
    if (status == MAPPING_CAPTURE_ACTIVE && event->capture != id)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: stream %p is being captured into a CUDA graph, and event %p was recorded outside "
                             "that capture: a graph cannot wait for work outside it (it would invalidate the "
                             "capture); record the event on a stream of the same capture, or wait before it",
                             fn, (const void *)stream, (const void *)event);
    if (status == MAPPING_CAPTURE_ACTIVE || !event->capture)
        return MAPPING_OK;
    /* The stream joins the capture the event marks a point of, if that
     * capture is still going on (as cuStreamWaitEvent does). */
    st = mapping__op_stream_capture_status(event->dev, (void *)(uintptr_t)event->stream_state, &event_status,
                                           &event_id);
    if (st == MAPPING_OK && (event_status != MAPPING_CAPTURE_ACTIVE || event_id != event->capture))
        st = mapping__capture_check_event(fn, event);
    return st;
}

mapping_status mapping_stream_capturing(mapping_stream *stream, int *capturing)
{
    static const char fn[] = "mapping_stream_capturing";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "stream", stream)) || (st = mapping__check_stream(fn, stream)) ||
        (st = mapping__check_ptr(fn, "capturing", capturing)))
        return st;
    int status = MAPPING_CAPTURE_NONE;
    *capturing = 0;
    if ((st = mapping__stream_capture_status(stream->dev, stream, &status, NULL)) == MAPPING_OK)
        *capturing = status == MAPPING_CAPTURE_ACTIVE || status == MAPPING_CAPTURE_INVALIDATED;
    return st;
}
