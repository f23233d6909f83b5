/*
 * Several devices: mapping_copy_peer checks its arguments; the copy itself is
 * mapping__copy_peer (core/ops.c).
 */
#include <stdlib.h>
#include "core/ops.h"
#include "os/os.h"

mapping_status mapping_copy_peer(mapping_stream *stream, const mapping_buffer *src, size_t src_offset,
                                 mapping_buffer *dst, size_t dst_offset, size_t bytes)
{
    static const char fn[] = "mapping_copy_peer";
    mapping_status st = mapping__check_copy(fn, stream, src, src_offset, dst, dst_offset, bytes);
    if (st)
        return st;
    if (stream && stream->dev != dst->dev)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH,
                             "%s: the stream must belong to the destination's device (dst buffer %p); it belongs to %s",
                             fn, (const void *)dst, stream->dev == src->dev ? "the source's device" : "a third device");
    static const char not_captured[] = "closing the source's device could not wait for the graph's replays of the "
                                       "copy (nor, between back ends, could it be staged at each replay)";
    if ((st = mapping__check_no_overlap(fn, src, src_offset, dst, dst_offset, bytes)) ||
        (st = mapping__stream_refuse_capture_why(dst->dev, stream, fn, not_captured)) ||
        (!stream && src->dev != dst->dev && (st = mapping__stream_refuse_capture_why(src->dev, NULL, fn, not_captured))))
        return st;
    return mapping__copy_peer(stream, src, src_offset, dst, dst_offset, bytes);
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

mapping_status mapping__peer_link_measure(mapping_device *src, mapping_device *dst, mapping_link *out)
{
    enum { SMALL = 64, SMALL_RUNS = 11, BIG_RUNS = 3 };
    const size_t big = (size_t)8 << 20;
    void *a = NULL, *b = NULL;
    mapping_status st = mapping__op_buffer_alloc(src, big, &a);
    if (st == MAPPING_OK)
        st = mapping__op_buffer_alloc(dst, big, &b);
    double small[SMALL_RUNS], large[BIG_RUNS];
    for (int i = 0; i < SMALL_RUNS && st == MAPPING_OK; i++) {
        double t0 = mapping_os_now();
        st = mapping__op_peer_copy_uncounted(dst, src, a, b, SMALL);
        small[i] = mapping_os_now() - t0;
    }
    for (int i = 0; i < BIG_RUNS && st == MAPPING_OK; i++) {
        double t0 = mapping_os_now();
        st = mapping__op_peer_copy_uncounted(dst, src, a, b, big);
        large[i] = mapping_os_now() - t0;
    }
    if (st == MAPPING_OK) {
        qsort(small, SMALL_RUNS, sizeof *small, compare_doubles);
        qsort(large, BIG_RUNS, sizeof *large, compare_doubles);
        double lat = small[SMALL_RUNS / 2], t = large[BIG_RUNS / 2];
        out->latency = lat > 1e-9 ? lat : 1e-9;
        out->bandwidth = (double)big / (t > lat ? t - lat : t);
    }
    if (a)
        mapping__op_buffer_free(src, a);
    if (b)
        mapping__op_buffer_free(dst, b);
    return st;
}
