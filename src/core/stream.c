/*
 * Streams and events: the public functions validate, then call the internal
 * ones (mapping__X for mapping_X), which the upper layers call directly.
 */
#include <stdlib.h>
#include "core/ops.h"

/* ---- internal: validated arguments ---- */

/* A new stream on the back end's new queue, or (imported) on the caller's
 * queue `native` (mapping_import_stream; NULL: the default native queue). */
static mapping_status stream_new(mapping_device *dev, bool imported, void *native, mapping_stream **out)
{
    *out = NULL;
    mapping_stream *s = mapping_os_handle_alloc(sizeof *s); /* see os/handle_arena.c */
    if (!s)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mapping_stream_create: out of memory");
    s->imported = imported;
    s->owner = NULL;
    mapping__fence_init(&s->fences);
    mapping_status st = imported ? mapping__op_stream_import(dev, native, &s->state)
                                 : mapping__op_stream_create(dev, &s->state);
    if (st == MAPPING_OK && mapping__handle_add(MAPPING_HANDLE_STREAM, s) != MAPPING_OK) {
        if (imported)
            mapping__op_stream_unimport(dev, s->state);
        else
            mapping__op_stream_destroy(dev, s->state);
        st = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mapping_stream_create: out of memory");
    }
    if (st != MAPPING_OK) {
        mapping_os_handle_free(s);
        return st;
    }
    s->dev = dev;
    mapping__list_add(dev, &dev->streams, &s->node);
    mapping__native_mark_wait(dev, s->state); /* after imports ordered on a native queue */
    *out = s;
    return MAPPING_OK;
}

mapping_status mapping__stream_create(mapping_device *dev, mapping_stream **out)
{
    return stream_new(dev, false, NULL, out);
}

mapping_status mapping__import_stream(mapping_device *dev, void *native, mapping_stream **out)
{
    *out = NULL;
    if (!mapping__can_import_stream(dev))
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "mapping_import_stream: back end %s has no native queues to import",
                             dev->be->name);
    return stream_new(dev, true, native, out);
}

void mapping__stream_destroy(mapping_stream *stream)
{
    if (!mapping__handle_remove(MAPPING_HANDLE_STREAM, stream))
        return; /* another thread destroys it: exactly one destroy goes ahead */
    mapping_device *dev = stream->dev;
    mapping_status st = mapping__stream_synchronize(stream);
    if (st != MAPPING_OK)
        mapping__log(1, "mapping_stream_destroy: queued work failed: %s", mapping_status_string(st));
    mapping__fences_drop_stream(stream); /* its copies from other devices are done */
    mapping__list_remove(dev, &stream->node);
    if (stream->imported)
        mapping__op_stream_unimport(dev, stream->state);
    else
        mapping__op_stream_destroy(dev, stream->state);
    mapping_os_handle_free(stream);
}

mapping_status mapping__event_record(mapping_stream *stream, mapping_event **out)
{
    *out = NULL;
    uint64_t capture = 0; /* in a capture: the event marks a point of the graph (core/capture.c) */
    mapping_status st = mapping__capture_check_queued("mapping_event_record", stream->dev, stream, false, &capture);
    if (st != MAPPING_OK)
        return st;
    mapping_event *ev = mapping_os_handle_alloc(sizeof *ev);
    if (!ev)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mapping_event_record: out of memory");
    mapping_device *dev = stream->dev;
    st = mapping__op_event_record(dev, stream->state, &ev->state);
    if (st == MAPPING_OK && mapping__handle_add(MAPPING_HANDLE_EVENT, ev) != MAPPING_OK) {
        mapping__op_event_destroy(dev, ev->state);
        st = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mapping_event_record: out of memory");
    }
    if (st != MAPPING_OK) {
        mapping_os_handle_free(ev);
        return st;
    }
    ev->dev = dev;
    ev->stream_state = stream->state;
    ev->capture = capture;
    mapping__list_add(dev, &dev->events, &ev->node);
    *out = ev;
    return MAPPING_OK;
}

void mapping__event_destroy(mapping_event *event)
{
    if (!mapping__handle_remove(MAPPING_HANDLE_EVENT, event))
        return; /* another thread destroyed it first */
    mapping__list_remove(event->dev, &event->node);
    mapping__op_event_destroy(event->dev, event->state);
    mapping_os_handle_free(event);
}

/* ---- public: validate once, then the internal function ---- */

mapping_status mapping_stream_create(mapping_device *dev, mapping_stream **out)
{
    static const char fn[] = "mapping_stream_create";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    return mapping__stream_create(dev, out);
}

void mapping_stream_destroy(mapping_stream *stream)
{
    static const char fn[] = "mapping_stream_destroy";
    if (!stream || mapping__check_stream(fn, stream) != MAPPING_OK ||
        mapping__check_not_in_host_fn(fn, stream) != MAPPING_OK)
        return;
    if (stream->owner) {
        mapping__fail(MAPPING_ERR_NOT_OWNED, "%s: stream %p belongs to a %s: destroy the %s instead; not destroyed", fn,
                      (void *)stream, stream->owner, stream->owner);
        return;
    }
    if (mapping__stream_refuse_capture_why(stream->dev, stream, fn,
                                           "destroying waits for the stream's work; not destroyed") != MAPPING_OK)
        return;
    mapping__stream_destroy(stream);
}

mapping_status mapping_stream_synchronize(mapping_stream *stream)
{
    static const char fn[] = "mapping_stream_synchronize";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "stream", stream)) || (st = mapping__check_stream(fn, stream)) ||
        (st = mapping__check_not_in_host_fn(fn, stream)) ||
        (st = mapping__stream_refuse_capture_why(stream->dev, stream, fn,
                                                 "the host cannot wait for a stream whose work is being recorded, "
                                                 "not run (it would invalidate the capture)")))
        return st;
    return mapping__stream_synchronize(stream);
}

mapping_status mapping_native_stream(const mapping_stream *stream, void **out)
{
    static const char fn[] = "mapping_native_stream";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "stream", stream)) || (st = mapping__check_stream(fn, stream)) ||
        (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    return mapping__op_stream_native(stream->dev, stream->state, out);
}

mapping_status mapping_launch_host(mapping_stream *stream, void (*fn_)(void *user), void *user)
{
    static const char fn[] = "mapping_launch_host";
    mapping_status st;
    if ((st = mapping__check_stream(fn, stream)) || (st = mapping__check_ptr(fn, "fn", (const void *)(uintptr_t)fn_)) ||
        (stream && (st = mapping__capture_check_queued(fn, stream->dev, stream, true, NULL))))
        return st;
    return mapping__launch_host(stream, fn_, user);
}

mapping_status mapping_event_record(mapping_stream *stream, mapping_event **out)
{
    static const char fn[] = "mapping_event_record";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "stream", stream)) || (st = mapping__check_stream(fn, stream)) ||
        (st = mapping__check_ptr(fn, "out", out)))
        return st;
    return mapping__event_record(stream, out);
}

mapping_status mapping_stream_wait_event(mapping_stream *stream, mapping_event *event)
{
    static const char fn[] = "mapping_stream_wait_event";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "stream", stream)) || (st = mapping__check_stream(fn, stream)) ||
        (st = mapping__check_event(fn, "event", event)))
        return st;
    if (event->dev != stream->dev)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH, "%s: the event belongs to another device", fn);
    if ((st = mapping__capture_check_wait(fn, stream, event)))
        return st;
    return mapping__stream_wait_event(stream, event);
}

mapping_status mapping_event_synchronize(mapping_event *event)
{
    static const char fn[] = "mapping_event_synchronize";
    mapping_status st = mapping__check_event(fn, "event", event);
    if (st == MAPPING_OK)
        st = mapping__capture_check_event(fn, event);
    return st ? st : mapping__event_wait(fn, event);
}

mapping_status mapping__event_wait(const char *fn, mapping_event *event)
{
    /* From a host function on the event's own stream, an event recorded
     * after the function is not complete and never will be while it runs
     * (one recorded before it is complete: stream order). */
    const void *worker = mapping_os_worker_stream();
    if (worker && worker == event->stream_state && mapping__event_query(event) != MAPPING_OK)
        return mapping__fail(MAPPING_ERR_BUSY,
                             "%s: called from a host function running on the stream the event was recorded on, "
                             "before the event: it would wait for itself",
                             fn);
    return mapping__event_synchronize(event);
}

mapping_status mapping_event_query(const mapping_event *event)
{
    mapping_status st = mapping__check_event("mapping_event_query", "event", event);
    if (st == MAPPING_OK)
        st = mapping__capture_check_event("mapping_event_query", event);
    return st ? st : mapping__event_query(event);
}

mapping_status mapping_event_elapsed(const mapping_event *start, const mapping_event *end, double *seconds)
{
    static const char fn[] = "mapping_event_elapsed";
    mapping_status st;
    if ((st = mapping__check_event(fn, "start", start)) || (st = mapping__check_event(fn, "end", end)) ||
        (st = mapping__check_ptr(fn, "seconds", seconds)))
        return st;
    if (start->dev != end->dev)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH, "%s: the events belong to different devices", fn);
    if ((st = mapping__capture_check_event(fn, start)) || (st = mapping__capture_check_event(fn, end)))
        return st;
    return mapping__event_elapsed(start, end, seconds);
}

void mapping_event_destroy(mapping_event *event)
{
    if (!event || mapping__check_event("mapping_event_destroy", "event", event) != MAPPING_OK)
        return;
    mapping__event_destroy(event);
}
