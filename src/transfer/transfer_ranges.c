/*
 * Many ranges of one host array and one buffer, for mirrors
 * (mapping__transfer_ranges, mapping__transfer_sorted_ranges): checked once,
 * then moved by the one-pass flush or the mapped copies where they fit
 * (batch_direct.c, batch_mapped.c), else queued in a batch and flushed.
 */
#include <stdint.h>
#include "core/ops.h"
#include "transfer/transfer.h"

/* The handles and the base: once per list. */
static mapping_status check_list_args(const char *fn, mapping_stream *stream, void *host, mapping_buffer *buf,
                                      size_t base, const mapping_range *ranges, size_t count)
{
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "host", host)) || (st = mapping__check_buffer(fn, "buf", buf)) ||
        (st = mapping__check_stream(fn, stream)) || (st = mapping__check_same_device(fn, buf->dev, stream)) ||
        (count && (st = mapping__check_ptr(fn, "ranges", ranges))))
        return st;
    if (base > buf->size)
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "%s: base %zu is past buf's %zu bytes", fn, base, buf->size);
    return MAPPING_OK;
}

/* Whether the one-pass flush (or the mapped copies) can take a list whose
 * ranges are sorted and disjoint, the longest `largest` bytes. */
static bool list_is_direct(mapping_stream *stream, const mapping_buffer *buf, size_t largest)
{
    return !stream && mapping__can_scatter(buf->dev) && mapping__can_gather(buf->dev) && largest < BATCH_LARGE_MIN;
}

/* One pass: each range within buf; whether they are sorted and disjoint,
 * and the longest one's bytes. */
static mapping_status check_ranges(const char *fn, mapping_buffer *buf, size_t base, const mapping_range *ranges,
                                   size_t count, bool *in_order, size_t *largest)
{
    mapping_status st;
    *in_order = true;
    *largest = 0;
    for (size_t i = 0, end = 0; i < count; i++) {
        const mapping_range *r = &ranges[i];
        if (r->hi <= r->lo) {
            if (r->hi == r->lo)
                continue;
            return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: range %zu ends (%zu) before it starts (%zu)", fn,
                                 i, r->hi, r->lo);
        }
        size_t bytes = r->hi - r->lo;
        if (r->lo > SIZE_MAX - base)
            return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "%s: range %zu starts past any buffer", fn, i);
        if ((st = mapping__check_range(fn, "buf", base + r->lo, bytes, buf->size)))
            return st;
        *largest = bytes > *largest ? bytes : *largest;
        *in_order = *in_order && r->lo >= end;
        end = r->hi;
    }
    return MAPPING_OK;
}

/* The list, checked (or promised) to be within buf: through the one-pass
 * or mapped path when `direct`, else queued in the batch and flushed. */
static mapping_status transfer_checked(mapping_stream *stream, mapping_batch *reuse, bool to_gpu, void *host,
                                       mapping_buffer *buf, size_t base, const mapping_range *ranges, size_t count,
                                       bool direct)
{
    static const char fn[] = "mapping__transfer_ranges";
    mapping_status st = MAPPING_OK;
    mapping_batch *b = reuse;
    if (!b && (st = mapping__batch_create(buf->dev, &b)) != MAPPING_OK)
        return st;
    if (b->count != 0 || b->dev != buf->dev) {
        st = mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: the batch to reuse must be empty and of buf's device", fn);
        goto out;
    }
    if (direct) {
        st = mapping__can_map(b->dev)
                 ? mapping__batch_mapped_ranges(b, to_gpu, host, buf, base, ranges, count)
                 : mapping__batch_direct_ranges(mapping__blocking_stream(b->dev), b, to_gpu, host, buf, base, ranges,
                                                count);
        goto out;
    }
    for (size_t i = 0; i < count && st == MAPPING_OK; i++) {
        if (ranges[i].hi == ranges[i].lo)
            continue;
        char *h = (char *)host + ranges[i].lo;
        batch_copy c = {.buf = buf, .offset = base + ranges[i].lo, .bytes = ranges[i].hi - ranges[i].lo,
                        .to_gpu = to_gpu, .dst = h};
        st = mapping__batch_push(b, &c);
    }
    if (st == MAPPING_OK)
        st = mapping__batch_flush(stream, b);
    else
        mapping__batch_clear(b);
out:
    if (b != reuse)
        mapping__batch_destroy(b);
    return st;
}

mapping_status mapping__transfer_ranges(mapping_stream *stream, mapping_batch *reuse, bool to_gpu, void *host,
                                        mapping_buffer *buf, size_t base, const mapping_range *ranges,
                                        size_t count)
{
    static const char fn[] = "mapping__transfer_ranges";
    mapping_status st;
    bool in_order = false;
    size_t largest = 0;
    if ((st = check_list_args(fn, stream, host, buf, base, ranges, count)) ||
        (st = check_ranges(fn, buf, base, ranges, count, &in_order, &largest)))
        return st;
    bool direct = in_order && list_is_direct(stream, buf, largest);
    return transfer_checked(stream, reuse, to_gpu, host, buf, base, ranges, count, direct);
}

mapping_status mapping__transfer_sorted_ranges(mapping_stream *stream, mapping_batch *reuse, bool to_gpu, void *host,
                                               mapping_buffer *buf, size_t base, const mapping_range *ranges,
                                               size_t count, size_t largest)
{
#ifndef NDEBUG /* the caller's promise, checked where assertions are (the sanitizer builds) */
    static const char fn[] = "mapping__transfer_sorted_ranges";
    mapping_status st;
    if ((st = check_list_args(fn, stream, host, buf, base, ranges, count)))
        return st;
    bool in_order;
    size_t longest;
    if ((st = check_ranges(fn, buf, base, ranges, count, &in_order, &longest)))
        return st;
    if (!in_order || longest > largest)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: the ranges broke the caller's promise (sorted and disjoint: %s; longest %zu bytes, "
                             "promised at most %zu)",
                             fn, in_order ? "yes" : "no", longest, largest);
#endif
    bool direct = list_is_direct(stream, buf, largest);
    return transfer_checked(stream, reuse, to_gpu, host, buf, base, ranges, count, direct);
}
