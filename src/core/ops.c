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
