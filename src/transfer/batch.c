/* Batches: create, destroy, and queueing copies (validated at add time). */
#include <stdlib.h>
#include <string.h>
#include "core/ops.h"
#include "transfer/transfer.h"

mapping_status mapping__batch_check(const char *fn, const mapping_batch *b)
{
    if (!b)
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: batch is NULL", fn);
    if (!mapping__handle_live(MAPPING_HANDLE_BATCH, b))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: batch %p is not a live batch", fn, (const void *)b);
    if (!mapping__device_alive(b->dev, b->dev_serial))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: the device of batch %p was closed before it", fn,
                             (const void *)b);
    if (b->busy)
        return mapping__fail(MAPPING_ERR_BUSY, "%s: batch %p is being flushed (called from a callback of its own flush)",
                             fn, (const void *)b);
    return MAPPING_OK;
}

mapping_status mapping__batch_create(mapping_device *dev, mapping_batch **out)
{
    *out = NULL;
    mapping_batch *b = mapping_os_calloc(1, sizeof *b);
    if (!b)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mapping_batch_create: out of memory");
    b->dev = dev;
    b->dev_serial = dev->serial;
    *out = b;
    return MAPPING_OK;
}

/* The last flush's queued work reads the plan and the staging memory. If
 * waiting for it fails, the event is kept: that work may still run, so its
 * memory is not reused, and a later call waits again. */
mapping_status mapping__batch_wait_pending(mapping_batch *b)
{
    if (!b->pending)
        return MAPPING_OK;
    mapping_status st = mapping__event_synchronize(b->pending);
    if (st != MAPPING_OK)
        return st;
    mapping__event_destroy(b->pending);
    b->pending = NULL;
    return MAPPING_OK;
}

void mapping__batch_destroy(mapping_batch *b)
{
    /* Wait twice; then rather than free memory that the last flush's work may
     * still use, leave the batch (and its staging, freed with the device) be. */
    if (mapping__batch_wait_pending(b) != MAPPING_OK && mapping__batch_wait_pending(b) != MAPPING_OK) {
        mapping__log(0, "mapping_batch_destroy: the last flush could not be waited for: %s; its memory is "
                        "not freed (the staging memory goes with mapping_close)", mapping__last_message());
        return;
    }
    mapping__batch_plan_free(&b->plan);
    mapping__batch_free_staging(b);
    free(b->copies);
    free(b);
}

void mapping__batch_forget(mapping_batch *b)
{
    mapping__batch_plan_free(&b->plan);
    free(b->copies);
    free(b);
}

mapping_status mapping_batch_create(mapping_device *dev, mapping_batch **out)
{
    static const char fn[] = "mapping_batch_create";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)) ||
        (st = mapping__batch_create(dev, out)))
        return st;
    /* Only batches handed to the caller are registered (a mirror's are not). */
    if (mapping__handle_add(MAPPING_HANDLE_BATCH, *out) != MAPPING_OK) {
        mapping__batch_destroy(*out);
        *out = NULL;
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    }
    return MAPPING_OK;
}

void mapping_batch_destroy(mapping_batch *b)
{
    static const char fn[] = "mapping_batch_destroy";
    if (!b)
        return;
    mapping_status st = mapping__batch_check(fn, b);
    if (st == MAPPING_ERR_INVALID_HANDLE && mapping__handle_live(MAPPING_HANDLE_BATCH, b)) {
        /* Its device was closed first, and took the batch's staging and
         * event with it: free what is the batch's own, and keep the error. */
        mapping__handle_remove(MAPPING_HANDLE_BATCH, b);
        mapping__batch_forget(b);
        return;
    }
    if (st != MAPPING_OK || !mapping__handle_remove(MAPPING_HANDLE_BATCH, b))
        return;
    mapping__batch_destroy(b);
}

size_t mapping_batch_count(const mapping_batch *b)
{
    return mapping__handle_live(MAPPING_HANDLE_BATCH, b) ? b->count : 0;
}

void mapping_batch_clear(mapping_batch *b)
{
    if (b && mapping__batch_check("mapping_batch_clear", b) == MAPPING_OK)
        mapping__batch_clear(b);
}

mapping_status mapping__batch_push(mapping_batch *b, const batch_copy *c)
{
    if (b->count == b->capacity) {
        size_t capacity = b->capacity ? b->capacity * 2 : 64;
        batch_copy *copies = mapping_os_realloc(b->copies, capacity * sizeof *copies);
        if (!copies)
            return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "batch: out of memory queueing copy %zu", b->count);
        b->copies = copies;
        b->capacity = capacity;
    }
    b->copies[b->count++] = *c;
    if (c->bytes > b->largest)
        b->largest = c->bytes;
    mapping__count(&b->dev->counters.batch_copies, 1);
    return MAPPING_OK;
}

static mapping_status check_copy(const char *fn, const mapping_batch *b, const void *host, const char *host_name,
                                 const mapping_buffer *buf, const char *buf_name, size_t offset, size_t bytes)
{
    mapping_status st;
    if ((st = mapping__batch_check(fn, b)) || (st = mapping__check_ptr(fn, host_name, host)) ||
        (st = mapping__check_buffer(fn, buf_name, buf)) ||
        (st = mapping__check_range(fn, buf_name, offset, bytes, buf->size)))
        return st;
    if (buf->dev != b->dev)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH, "%s: %s belongs to another device than the batch", fn,
                             buf_name);
    return MAPPING_OK;
}

mapping_status mapping_batch_sync_to_gpu(mapping_batch *b, const void *cpu_src, mapping_buffer *gpu_dst,
                                         size_t gpu_offset, size_t bytes)
{
    mapping_status st = check_copy("mapping_batch_sync_to_gpu", b, cpu_src, "cpu_src", gpu_dst, "gpu_dst",
                                   gpu_offset, bytes);
    if (st)
        return st;
    batch_copy c = {.buf = gpu_dst, .offset = gpu_offset, .bytes = bytes, .src = cpu_src, .to_gpu = true};
    return mapping__batch_push(b, &c);
}

mapping_status mapping_batch_sync_to_cpu(mapping_batch *b, const mapping_buffer *gpu_src, size_t gpu_offset,
                                         void *cpu_dst, size_t bytes)
{
    mapping_status st = check_copy("mapping_batch_sync_to_cpu", b, cpu_dst, "cpu_dst", gpu_src, "gpu_src",
                                   gpu_offset, bytes);
    if (st)
        return st;
    /* The buffer is only read; the cast keeps one copy record for both directions. */
    batch_copy c = {.buf = (mapping_buffer *)(uintptr_t)gpu_src, .offset = gpu_offset, .bytes = bytes, .dst = cpu_dst,
                    .to_gpu = false};
    return mapping__batch_push(b, &c);
}

/* Straight through once the latency is a small part of the transfer: a
 * group this large gains little from merging and would cost a CPU copy into
 * staging. Never below BATCH_LARGE_MIN: a batch whose copies are all smaller
 * does not need the link (measuring it costs a new device ~15 ms). */
size_t mapping__batch_large_bytes(mapping_device *dev)
{
    mapping_link link;
    double bytes = 0;
    if (mapping__device_link(dev, &link) == MAPPING_OK)
        bytes = 4 * link.latency * link.bandwidth;
    const double lo = BATCH_LARGE_MIN, hi = 4 << 20;
    return (size_t)(bytes < lo ? lo : bytes > hi ? hi : bytes);
}
