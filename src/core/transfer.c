/* The public copies: validate every argument, then call src/core/ops.c. */
#include "core/ops.h"

/* The checks and the copy, under the name of the public function called. */
static mapping_status write_range(const char *fn, mapping_stream *stream, const void *cpu_src, mapping_buffer *gpu_dst,
                                  size_t gpu_offset, size_t bytes)
{
    mapping_status st;
    if ((st = mapping__check_stream(fn, stream)) || (st = mapping__check_ptr(fn, "cpu_src", cpu_src)) ||
        (st = mapping__check_buffer(fn, "gpu_dst", gpu_dst)) ||
        (st = mapping__check_range(fn, "gpu_dst", gpu_offset, bytes, gpu_dst->size)) ||
        (st = mapping__check_same_device(fn, gpu_dst->dev, stream)) ||
        (st = mapping__capture_check_copy(fn, gpu_dst->dev, stream, cpu_src, bytes)))
        return st;
    if ((st = mapping__write(stream, cpu_src, gpu_dst, gpu_offset, bytes)) == MAPPING_OK)
        mapping__count(&gpu_dst->dev->counters.h2d_payload_bytes, bytes);
    return st;
}

static mapping_status read_range(const char *fn, mapping_stream *stream, const mapping_buffer *gpu_src,
                                 size_t gpu_offset, void *cpu_dst, size_t bytes)
{
    mapping_status st;
    if ((st = mapping__check_stream(fn, stream)) || (st = mapping__check_buffer(fn, "gpu_src", gpu_src)) ||
        (st = mapping__check_ptr(fn, "cpu_dst", cpu_dst)) ||
        (st = mapping__check_range(fn, "gpu_src", gpu_offset, bytes, gpu_src->size)) ||
        (st = mapping__check_same_device(fn, gpu_src->dev, stream)) ||
        (st = mapping__capture_check_copy(fn, gpu_src->dev, stream, cpu_dst, bytes)))
        return st;
    if ((st = mapping__read(stream, gpu_src, gpu_offset, cpu_dst, bytes)) == MAPPING_OK)
        mapping__count(&gpu_src->dev->counters.d2h_payload_bytes, bytes);
    return st;
}

mapping_status mapping_sync_to_gpu_range(mapping_stream *stream, const void *cpu_src, mapping_buffer *gpu_dst,
                                         size_t gpu_offset, size_t bytes)
{
    return write_range("mapping_sync_to_gpu_range", stream, cpu_src, gpu_dst, gpu_offset, bytes);
}

mapping_status mapping_sync_to_cpu_range(mapping_stream *stream, const mapping_buffer *gpu_src, size_t gpu_offset,
                                         void *cpu_dst, size_t bytes)
{
    return read_range("mapping_sync_to_cpu_range", stream, gpu_src, gpu_offset, cpu_dst, bytes);
}

mapping_status mapping_sync_to_gpu(const void *cpu_src, mapping_buffer *gpu_dst)
{
    static const char fn[] = "mapping_sync_to_gpu";
    mapping_status st = mapping__check_buffer(fn, "gpu_dst", gpu_dst);
    return st ? st : write_range(fn, NULL, cpu_src, gpu_dst, 0, gpu_dst->size);
}

mapping_status mapping_sync_to_cpu(const mapping_buffer *gpu_src, void *cpu_dst)
{
    static const char fn[] = "mapping_sync_to_cpu";
    mapping_status st = mapping__check_buffer(fn, "gpu_src", gpu_src);
    return st ? st : read_range(fn, NULL, gpu_src, 0, cpu_dst, gpu_src->size);
}

mapping_status mapping_copy_gpu(mapping_stream *stream, const mapping_buffer *src, size_t src_offset,
                                mapping_buffer *dst, size_t dst_offset, size_t bytes)
{
    static const char fn[] = "mapping_copy_gpu";
    mapping_status st = mapping__check_copy(fn, stream, src, src_offset, dst, dst_offset, bytes);
    if (st)
        return st;
    if (src->dev != dst->dev)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH, "%s: src and dst belong to different devices", fn);
    if ((st = mapping__check_same_device(fn, dst->dev, stream)) ||
        (st = mapping__check_no_overlap(fn, src, src_offset, dst, dst_offset, bytes)) ||
        (st = mapping__capture_check_queued(fn, dst->dev, stream, false, NULL)))
        return st;
    return mapping__copy(stream, src, src_offset, dst, dst_offset, bytes);
}

mapping_status mapping_fill_gpu(mapping_stream *stream, mapping_buffer *dst, size_t offset, size_t bytes,
                                unsigned char value)
{
    static const char fn[] = "mapping_fill_gpu";
    mapping_status st;
    if ((st = mapping__check_stream(fn, stream)) || (st = mapping__check_buffer(fn, "dst", dst)) ||
        (st = mapping__check_range(fn, "dst", offset, bytes, dst->size)) ||
        (st = mapping__check_same_device(fn, dst->dev, stream)) ||
        (st = mapping__capture_check_queued(fn, dst->dev, stream, false, NULL)))
        return st;
    return mapping__fill(stream, dst, offset, bytes, value);
}
