/*
 * The seam to the drivers (see ops.h): every call through a back end's
 * table, with fault injection, page-locked lookup, timing and statistics.
 */
#include "core/ops.h"
#include "os/os.h"

/* Blocking transfers at least this large are timed for the statistics;
 * reading the clock twice costs more than a small copy does. */
enum { TIMED_TRANSFER_MIN = 64 * 1024 };

/* The stream argument to the back end and the device both come from the
 * buffer: the caller checked that the stream (if any) is of the same device. */

mapping_status mapping__write(mapping_stream *stream, const void *src, mapping_buffer *dst, size_t dst_offset,
                              size_t bytes)
{
    mapping_device *dev = dst->dev;
    mapping_status st = mapping__fault_check(dev, "write");
    if (st != MAPPING_OK)
        return st;
    mapping_host_ref ref;
    const mapping_host_ref *pinned = mapping__host_registry_find(&dev->host_blocks, src, bytes, &ref) ? &ref : NULL;
    uint64_t t0 = !stream && bytes >= TIMED_TRANSFER_MIN ? mapping_os_now_ns() : 0;
    st = dev->be->write(dev->state, mapping__stream_state(stream), src, pinned, dst->mem, dst_offset, bytes);
    if (st != MAPPING_OK)
        return st;
    if (t0)
        mapping__count(&dev->counters.blocking_ns, mapping_os_now_ns() - t0);
    mapping__count(&dev->counters.h2d_bytes, bytes);
    mapping__count(&dev->counters.h2d_copies, 1);
    return MAPPING_OK;
}

mapping_status mapping__read(mapping_stream *stream, const mapping_buffer *src, size_t src_offset, void *dst,
                             size_t bytes)
{
    mapping_device *dev = src->dev;
    mapping_status st = mapping__fault_check(dev, "read");
    if (st != MAPPING_OK)
        return st;
    mapping_host_ref ref;
    const mapping_host_ref *pinned = mapping__host_registry_find(&dev->host_blocks, dst, bytes, &ref) ? &ref : NULL;
    uint64_t t0 = !stream && bytes >= TIMED_TRANSFER_MIN ? mapping_os_now_ns() : 0;
    st = dev->be->read(dev->state, mapping__stream_state(stream), src->mem, src_offset, dst, pinned, bytes);
    if (st != MAPPING_OK)
        return st;
    if (t0)
        mapping__count(&dev->counters.blocking_ns, mapping_os_now_ns() - t0);
    mapping__count(&dev->counters.d2h_bytes, bytes);
    mapping__count(&dev->counters.d2h_copies, 1);
    return MAPPING_OK;
}

mapping_status mapping__copy(mapping_stream *stream, const mapping_buffer *src, size_t src_offset,
                             mapping_buffer *dst, size_t dst_offset, size_t bytes)
{
    mapping_device *dev = dst->dev;
    mapping_status st = mapping__fault_check(dev, "copy");
    if (st != MAPPING_OK)
        return st;
    st = dev->be->copy(dev->state, mapping__stream_state(stream), src->mem, src_offset, dst->mem, dst_offset, bytes);
    if (st != MAPPING_OK)
        return st;
    mapping__count(&dev->counters.d2d_bytes, bytes);
    mapping__count(&dev->counters.d2d_copies, 1);
    return MAPPING_OK;
}

mapping_status mapping__fill(mapping_stream *stream, mapping_buffer *dst, size_t offset, size_t bytes,
                             unsigned char value)
{
    mapping_device *dev = dst->dev;
    mapping_status st = mapping__fault_check(dev, "fill");
    if (st != MAPPING_OK)
        return st;
    st = dev->be->fill(dev->state, mapping__stream_state(stream), dst->mem, offset, bytes, value);
    if (st != MAPPING_OK)
        return st;
    mapping__count(&dev->counters.fill_bytes, bytes);
    mapping__count(&dev->counters.fills, 1);
    return MAPPING_OK;
}

/* A scatter or gather counts as one device-side copy of its entries' bytes. */
static void count_table(mapping_device *dev, const mapping_scatter_entry *table, size_t count)
{
    uint64_t bytes = 0;
    for (size_t k = 0; k < count; k++)
        bytes += table[k].bytes;
    mapping__count(&dev->counters.d2d_bytes, bytes);
    mapping__count(&dev->counters.d2d_copies, 1);
}

mapping_status mapping__scatter(mapping_stream *stream, mapping_buffer *staging, size_t table_offset,
                                const mapping_scatter_entry *table, size_t count, mapping_buffer *dst)
{
    mapping_device *dev = dst->dev;
    mapping_status st = mapping__fault_check(dev, "scatter");
    if (st != MAPPING_OK)
        return st;
    st = dev->be->scatter(dev->state, mapping__stream_state(stream), staging->mem, table_offset, table, count,
                          dst->mem);
    if (st != MAPPING_OK)
        return st;
    count_table(dev, table, count);
    return MAPPING_OK;
}

mapping_status mapping__gather(mapping_stream *stream, const mapping_buffer *src, mapping_buffer *staging,
                               size_t table_offset, const mapping_scatter_entry *table, size_t count)
{
    mapping_device *dev = src->dev;
    mapping_status st = mapping__fault_check(dev, "gather");
    if (st != MAPPING_OK)
        return st;
    st = dev->be->gather(dev->state, mapping__stream_state(stream), src->mem, staging->mem, table_offset, table,
                         count);
    if (st != MAPPING_OK)
        return st;
    count_table(dev, table, count);
    return MAPPING_OK;
}

mapping_status mapping__prefetch(mapping_stream *stream, mapping_buffer *buf, size_t offset, size_t bytes,
                                 bool to_device)
{
    mapping_device *dev = buf->dev;
    mapping_status st = mapping__fault_check_any(dev, "prefetch");
    if (st != MAPPING_OK)
        return st;
    return dev->be->unified_prefetch(dev->state, mapping__stream_state(stream), buf->mem, offset, bytes, to_device);
}

/* ---- optional table entries ---- */

bool mapping__can_scatter(const mapping_device *dev)
{
    return dev->be->scatter != NULL;
}

bool mapping__can_gather(const mapping_device *dev)
{
    return dev->be->gather != NULL;
}

bool mapping__can_prefetch(const mapping_device *dev)
{
    return dev->be->unified_prefetch != NULL;
}

bool mapping__can_allocate_unified(const mapping_device *dev)
{
    return dev->be->buffer_alloc_unified != NULL;
}

bool mapping__can_register_host(const mapping_device *dev)
{
    return dev->be->host_register != NULL && dev->be->host_unregister != NULL;
}

/* ---- streams and events ---- */

mapping_status mapping__stream_synchronize(mapping_stream *stream)
{
    mapping_status st = mapping__fault_check_any(stream->dev, "stream_synchronize");
    if (st != MAPPING_OK)
        return st;
    return stream->dev->be->stream_synchronize(stream->dev->state, stream->state);
}

mapping_status mapping__launch_host(mapping_stream *stream, void (*fn)(void *user), void *user)
{
    if (!stream) {
        fn(user);
        return MAPPING_OK;
    }
    mapping_status st = mapping__fault_check_any(stream->dev, "launch_host");
    if (st != MAPPING_OK)
        return st;
    return stream->dev->be->launch_host(stream->dev->state, stream->state, fn, user);
}

mapping_status mapping__stream_wait_event(mapping_stream *stream, mapping_event *event)
{
    mapping_status st = mapping__fault_check_any(stream->dev, "stream_wait_event");
    if (st != MAPPING_OK)
        return st;
    return stream->dev->be->event_wait(stream->dev->state, stream->state, event->state);
}

mapping_status mapping__event_synchronize(mapping_event *event)
{
    mapping_status st = mapping__fault_check_any(event->dev, "event_synchronize");
    if (st != MAPPING_OK)
        return st;
    return event->dev->be->event_synchronize(event->dev->state, event->state);
}

mapping_status mapping__event_query(const mapping_event *event)
{
    mapping_status st = mapping__fault_check_any(event->dev, "event_query");
    if (st != MAPPING_OK)
        return st;
    return event->dev->be->event_query(event->dev->state, event->state);
}

mapping_status mapping__event_elapsed(const mapping_event *start, const mapping_event *end, double *seconds)
{
    return start->dev->be->event_elapsed(start->dev->state, start->state, end->state, seconds);
}

/* ---- the back-end half of object lifetimes ---- */

mapping_status mapping__op_device_info(const mapping_backend *be, int index, mapping_device_info *info)
{
    return be->device_info(index, info);
}

mapping_status mapping__op_device_open(const mapping_backend *be, int index, const mapping_device_desc *desc,
                                       void **state)
{
    return be->device_open(index, desc, state);
}

unsigned mapping__op_device_open_caps(mapping_device *dev)
{
    return dev->be->device_open_caps ? dev->be->device_open_caps(dev->state) : 0;
}

void mapping__op_device_close(mapping_device *dev)
{
    dev->be->device_close(dev->state);
}

mapping_status mapping__op_device_native(const mapping_device *dev, mapping_native_device *out)
{
    return dev->be->device_native ? dev->be->device_native(dev->state, out) : MAPPING_OK;
}

mapping_status mapping__op_buffer_alloc(mapping_device *dev, size_t bytes, void **mem)
{
    return dev->be->buffer_alloc(dev->state, bytes, mem);
}

mapping_status mapping__op_buffer_alloc_unified(mapping_device *dev, size_t bytes, void **mem, void **host)
{
    return dev->be->buffer_alloc_unified(dev->state, bytes, mem, host);
}

void mapping__op_buffer_free(mapping_device *dev, void *mem)
{
    dev->be->buffer_free(dev->state, mem);
}

mapping_status mapping__op_buffer_native(mapping_device *dev, void *mem, void **native)
{
    return dev->be->buffer_native(dev->state, mem, native);
}

mapping_status mapping__op_host_alloc(mapping_device *dev, size_t bytes, void **ptr, void **cookie)
{
    mapping_status st = mapping__fault_check_any(dev, "host_alloc");
    if (st != MAPPING_OK)
        return st;
    return dev->be->host_alloc(dev->state, bytes, ptr, cookie);
}

void mapping__op_host_free(mapping_device *dev, void *ptr, void *cookie)
{
    dev->be->host_free(dev->state, ptr, cookie);
}

mapping_status mapping__op_host_register(mapping_device *dev, void *ptr, size_t bytes, void **cookie)
{
    mapping_status st = mapping__fault_check_any(dev, "host_register");
    if (st != MAPPING_OK)
        return st;
    return dev->be->host_register(dev->state, ptr, bytes, cookie);
}

void mapping__op_host_unregister(mapping_device *dev, void *ptr, void *cookie)
{
    if (dev->be->host_unregister)
        dev->be->host_unregister(dev->state, ptr, cookie);
}

mapping_status mapping__op_stream_create(mapping_device *dev, void **state)
{
    mapping_status st = mapping__fault_check_any(dev, "stream_create");
    if (st != MAPPING_OK)
        return st;
    return dev->be->stream_create(dev->state, state);
}

void mapping__op_stream_destroy(mapping_device *dev, void *state)
{
    dev->be->stream_destroy(dev->state, state);
}

mapping_status mapping__op_stream_native(mapping_device *dev, void *state, void **native)
{
    return dev->be->stream_native ? dev->be->stream_native(dev->state, state, native) : MAPPING_OK;
}

mapping_status mapping__op_event_record(mapping_device *dev, void *stream_state, void **event_state)
{
    mapping_status st = mapping__fault_check_any(dev, "event_record");
    if (st != MAPPING_OK)
        return st;
    return dev->be->event_record(dev->state, stream_state, event_state);
}

void mapping__op_event_destroy(mapping_device *dev, void *event_state)
{
    dev->be->event_destroy(dev->state, event_state);
}

mapping_status mapping__op_write_uncounted(mapping_device *dev, const void *src, const mapping_host_ref *pinned,
                                           void *dst_mem, size_t bytes)
{
    return dev->be->write(dev->state, NULL, src, pinned, dst_mem, 0, bytes);
}
