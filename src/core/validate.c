/* Argument checks of the public functions. Handles are looked up in the
 * registry of live objects (handles.c) before any field is read. */
#include "core/core.h"
#include "os/os.h"

bool mapping__device_alive(const mapping_device *dev, uint64_t serial)
{
    return mapping__handle_live(MAPPING_HANDLE_DEVICE, dev) && dev->serial == serial;
}

mapping_status mapping__null_fail(const char *fn, const char *what)
{
    return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: %s is NULL", fn, what);
}

mapping_status mapping__check_device(const char *fn, const mapping_device *dev)
{
    if (!dev)
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: device is NULL", fn);
    if (!mapping__handle_live(MAPPING_HANDLE_DEVICE, dev))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: device %p is not an open device", fn, (const void *)dev);
    return MAPPING_OK;
}

mapping_status mapping__check_buffer(const char *fn, const char *what, const mapping_buffer *buf)
{
    if (!buf)
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: %s is NULL", fn, what);
    if (!mapping__handle_live(MAPPING_HANDLE_BUFFER, buf))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: %s %p is not a live buffer", fn, what, (const void *)buf);
    return MAPPING_OK;
}

mapping_status mapping__check_stream(const char *fn, const mapping_stream *stream)
{
    if (stream && !mapping__handle_live(MAPPING_HANDLE_STREAM, stream))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: stream %p is not a live stream", fn,
                             (const void *)stream);
    return MAPPING_OK;
}

mapping_status mapping__check_event(const char *fn, const char *what, const mapping_event *ev)
{
    if (!ev)
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: %s is NULL", fn, what);
    if (!mapping__handle_live(MAPPING_HANDLE_EVENT, ev))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: %s %p is not a live event", fn, what, (const void *)ev);
    return MAPPING_OK;
}

mapping_status mapping__range_fail(const char *fn, const char *what, size_t offset, size_t bytes, size_t size)
{
    if (bytes == 0)
        return mapping__fail(MAPPING_ERR_ZERO_SIZE, "%s: bytes is 0", fn);
    return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "%s: %s offset %zu + bytes %zu is past its end (%zu bytes)", fn, what,
                         offset, bytes, size);
}

mapping_status mapping__check_same_device(const char *fn, const mapping_device *dev, const mapping_stream *stream)
{
    if (stream && stream->dev != dev)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH, "%s: the stream belongs to another device", fn);
    return MAPPING_OK;
}

mapping_status mapping__check_not_in_host_fn(const char *fn, const mapping_stream *stream)
{
    const void *worker = mapping_os_worker_stream();
    if (worker && stream && worker == stream->state)
        return mapping__fail(MAPPING_ERR_BUSY,
                             "%s: called from a host function running on stream %p, which would wait for itself", fn,
                             (const void *)stream);
    return MAPPING_OK;
}

mapping_status mapping__check_copy(const char *fn, const mapping_stream *stream, const mapping_buffer *src,
                                   size_t src_offset, const mapping_buffer *dst, size_t dst_offset, size_t bytes)
{
    mapping_status st;
    if ((st = mapping__check_stream(fn, stream)) || (st = mapping__check_buffer(fn, "src", src)) ||
        (st = mapping__check_buffer(fn, "dst", dst)) ||
        (st = mapping__check_range(fn, "src", src_offset, bytes, src->size)) ||
        (st = mapping__check_range(fn, "dst", dst_offset, bytes, dst->size)))
        return st;
    return MAPPING_OK;
}

mapping_status mapping__check_no_overlap(const char *fn, const mapping_buffer *src, size_t src_offset,
                                         const mapping_buffer *dst, size_t dst_offset, size_t bytes)
{
    if (src == dst && src_offset < dst_offset + bytes && dst_offset < src_offset + bytes)
        return mapping__fail(MAPPING_ERR_OVERLAP, "%s: [%zu, +%zu) and [%zu, +%zu) overlap in one buffer", fn,
                             src_offset, bytes, dst_offset, bytes);
    return MAPPING_OK;
}
