/*
 * Several devices: mapping_copy_peer checks its arguments; the copy itself is
 * mapping__copy_peer (core/ops.c).
 */
#include "core/ops.h"

mapping_status mapping_copy_peer(mapping_stream *stream, const mapping_buffer *src, size_t src_offset,
                                 mapping_buffer *dst, size_t dst_offset, size_t bytes)
{
    static const char fn[] = "mapping_copy_peer";
    mapping_status st;
    if ((st = mapping__check_stream(fn, stream)) || (st = mapping__check_buffer(fn, "src", src)) ||
        (st = mapping__check_buffer(fn, "dst", dst)) ||
        (st = mapping__check_range(fn, "src", src_offset, bytes, src->size)) ||
        (st = mapping__check_range(fn, "dst", dst_offset, bytes, dst->size)))
        return st;
    if (stream && stream->dev != dst->dev)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH,
                             "%s: the stream must belong to the destination's device (dst buffer %p); it belongs to %s",
                             fn, (const void *)dst, stream->dev == src->dev ? "the source's device" : "a third device");
    if (src == dst && src_offset < dst_offset + bytes && dst_offset < src_offset + bytes)
        return mapping__fail(MAPPING_ERR_OVERLAP, "%s: [%zu, +%zu) and [%zu, +%zu) overlap in one buffer", fn,
                             src_offset, bytes, dst_offset, bytes);
    return mapping__copy_peer(stream, src, src_offset, dst, dst_offset, bytes);
}
