/*
 * Native handles under their object-first names (mapping_device_native,
 * mapping_buffer_native, mapping_stream_native), the word order of every
 * other getter (mapping_buffer_size, mapping_device_link) and of the Python
 * package (Device.native, Buffer.native, Stream.native). The earlier names,
 * mapping_native_device_handles / _buffer / _stream (device.c, buffer.c,
 * stream.c), stay as deprecated synonyms.
 */
#include <string.h>
#include "core/ops.h"

mapping_status mapping_device_native(const mapping_device *dev, mapping_native_device *out)
{
    static const char fn[] = "mapping_device_native";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    memset(out, 0, sizeof *out);
    return mapping__op_device_native(dev, out);
}

mapping_status mapping_buffer_native(const mapping_buffer *buf, void **out)
{
    static const char fn[] = "mapping_buffer_native";
    mapping_status st;
    if ((st = mapping__check_buffer(fn, "buffer", buf)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    return mapping__op_buffer_native(buf->dev, buf->mem, out);
}

mapping_status mapping_stream_native(const mapping_stream *stream, void **out)
{
    static const char fn[] = "mapping_stream_native";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "stream", stream)) || (st = mapping__check_stream(fn, stream)) ||
        (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    return mapping__op_stream_native(stream->dev, stream->state, out);
}
