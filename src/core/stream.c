/* Streams and events: thin validation over the back end. */
#include <stdlib.h>
#include "core/core.h"

mapping_status mapping_stream_create(mapping_device *dev, mapping_stream **out)
{
    static const char fn[] = "mapping_stream_create";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    mapping_stream *s = calloc(1, sizeof *s);
    if (!s)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    if ((st = dev->be->stream_create(dev->state, &s->state)) != MAPPING_OK) {
        free(s);
        return st;
    }
    s->magic = MAPPING_MAGIC_STREAM;
    s->dev = dev;
    mapping__list_add(dev, &dev->streams, &s->node);
    *out = s;
    return MAPPING_OK;
}

void mapping_stream_destroy(mapping_stream *stream)
{
    static const char fn[] = "mapping_stream_destroy";
    if (!stream || mapping__check_stream(fn, stream) != MAPPING_OK)
        return;
    mapping_device *dev = stream->dev;
    mapping_status st = dev->be->stream_synchronize(dev->state, stream->state);
    if (st != MAPPING_OK)
        mapping__log(1, "%s: queued work failed: %s", fn, mapping_status_string(st));
    mapping__list_remove(dev, &stream->node);
    stream->magic = MAPPING_MAGIC_DEAD;
    dev->be->stream_destroy(dev->state, stream->state);
    free(stream);
}

mapping_status mapping_stream_synchronize(mapping_stream *stream)
{
    static const char fn[] = "mapping_stream_synchronize";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "stream", stream)) || (st = mapping__check_stream(fn, stream)))
        return st;
    return stream->dev->be->stream_synchronize(stream->dev->state, stream->state);
}

mapping_status mapping_native_stream(const mapping_stream *stream, void **out)
{
    static const char fn[] = "mapping_native_stream";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "stream", stream)) || (st = mapping__check_stream(fn, stream)) ||
        (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    mapping_device *dev = stream->dev;
    return dev->be->stream_native ? dev->be->stream_native(dev->state, stream->state, out) : MAPPING_OK;
}

mapping_status mapping_launch_host(mapping_stream *stream, void (*fn_)(void *user), void *user)
{
    static const char fn[] = "mapping_launch_host";
    mapping_status st;
    if ((st = mapping__check_stream(fn, stream)) || (st = mapping__check_ptr(fn, "fn", (const void *)(uintptr_t)fn_)))
        return st;
    if (!stream) {
        fn_(user);
        return MAPPING_OK;
    }
    return stream->dev->be->launch_host(stream->dev->state, stream->state, fn_, user);
}

mapping_status mapping_event_record(mapping_stream *stream, mapping_event **out)
{
    static const char fn[] = "mapping_event_record";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "stream", stream)) || (st = mapping__check_stream(fn, stream)) ||
        (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    mapping_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    mapping_device *dev = stream->dev;
    if ((st = dev->be->event_record(dev->state, stream->state, &ev->state)) != MAPPING_OK) {
        free(ev);
        return st;
    }
    ev->magic = MAPPING_MAGIC_EVENT;
    ev->dev = dev;
    mapping__list_add(dev, &dev->events, &ev->node);
    *out = ev;
    return MAPPING_OK;
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
    return stream->dev->be->event_wait(stream->dev->state, stream->state, event->state);
}

mapping_status mapping_event_synchronize(mapping_event *event)
{
    mapping_status st = mapping__check_event("mapping_event_synchronize", "event", event);
    return st ? st : event->dev->be->event_synchronize(event->dev->state, event->state);
}

mapping_status mapping_event_query(const mapping_event *event)
{
    mapping_status st = mapping__check_event("mapping_event_query", "event", event);
    return st ? st : event->dev->be->event_query(event->dev->state, event->state);
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
    return start->dev->be->event_elapsed(start->dev->state, start->state, end->state, seconds);
}

void mapping_event_destroy(mapping_event *event)
{
    if (!event || mapping__check_event("mapping_event_destroy", "event", event) != MAPPING_OK)
        return;
    mapping__list_remove(event->dev, &event->node);
    event->magic = MAPPING_MAGIC_DEAD;
    event->dev->be->event_destroy(event->dev->state, event->state);
    free(event);
}
