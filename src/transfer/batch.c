/* Batches: create, destroy, and queueing copies (validated at add time). */
#include <stdlib.h>
#include <string.h>
#include "core/ops.h"
#include "transfer/transfer.h"

/* The checks of mapping__batch_check after the lookup of b itself; the
 * device's is skipped when device_alive is known. */
static mapping_status batch_check_rest(const char *fn, const mapping_batch *b, bool device_alive)
{
    if (!device_alive && !mapping__device_alive(b->dev, b->dev_serial))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: the device of batch %p was closed before it", fn,
                             (const void *)b);
    if (b->busy)
        return mapping__fail(MAPPING_ERR_BUSY, "%s: batch %p is being flushed (called from a callback of its own flush)",
                             fn, (const void *)b);
    return MAPPING_OK;
}

static mapping_status batch_lookup(const char *fn, const mapping_batch *b)
{
    if (!b)
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: batch is NULL", fn);
    if (!mapping__handle_live(MAPPING_HANDLE_BATCH, b))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: batch %p is not a live batch", fn, (const void *)b);
    return MAPPING_OK;
}

mapping_status mapping__batch_check(const char *fn, const mapping_batch *b)
{
    mapping_status st = batch_lookup(fn, b);
    return st != MAPPING_OK ? st : batch_check_rest(fn, b, false);
}

mapping_status mapping__batch_create(mapping_device *dev, mapping_batch **out)
{
    *out = NULL;
    mapping_batch *b = mapping_os_handle_alloc(sizeof *b); /* see os/handle_arena.c */
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
    if (b->unwaited) { /* the same for a blocking flush whose one wait failed */
        mapping_status st = mapping__stream_synchronize(b->unwaited);
        if (st != MAPPING_OK)
            return st;
        b->unwaited = NULL;
    }
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
    mapping_os_handle_free(b);
}

void mapping__batch_forget(mapping_batch *b)
{
    mapping__batch_plan_free(&b->plan);
    free(b->copies);
    mapping_os_handle_free(b);
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
    /* 0 too for a batch whose device was closed (its copies went with it). */
    return mapping__handle_live(MAPPING_HANDLE_BATCH, b) && mapping__device_alive(b->dev, b->dev_serial) ? b->count : 0;
}

void mapping_batch_clear(mapping_batch *b)
{
    if (b && mapping__batch_check("mapping_batch_clear", b) == MAPPING_OK)
        mapping__batch_clear(b);
}

static mapping_status grow(mapping_batch *b)
{
    size_t capacity = b->capacity ? b->capacity * 2 : 64;
    batch_copy *copies = mapping_os_realloc(b->copies, capacity * sizeof *copies);
    if (!copies)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "batch: out of memory queueing copy %zu", b->count);
    b->copies = copies;
    b->capacity = capacity;
    return MAPPING_OK;
}

/* The record is written field by field in place: building it on the stack
 * and copying it costs a store-forwarding stall per add. */
static inline mapping_status push(mapping_batch *b, mapping_buffer *buf, size_t offset, size_t bytes,
                                  const void *host, bool to_gpu)
{
    mapping_status st;
    if (b->count == b->capacity && (st = grow(b)) != MAPPING_OK)
        return st;
    batch_copy *c = &b->copies[b->count++];
    c->buf = buf;
    c->offset = offset;
    c->bytes = bytes;
    c->src = host;
    c->to_gpu = to_gpu;
    if (b->count > 1 && !mapping__batch_in_order(c - 1, c))
        b->unsorted = true;
    if (bytes > b->largest)
        b->largest = bytes;
    b->payload[to_gpu] += bytes;
    mapping__count(&b->dev->counters.batch_copies, 1);
    return MAPPING_OK;
}

mapping_status mapping__batch_push(mapping_batch *b, const batch_copy *c)
{
    return push(b, c->buf, c->offset, c->bytes, c->src, c->to_gpu);
}

/* An add's checks. The batch is looked up when it is not the one this
 * thread last added to, or a handle was removed since; its device and the
 * buffer only when a handle was removed since the batch's last add, or the
 * buffer is another one: adding many copies to one buffer costs no hash
 * lookup at all. */
static _Thread_local MAPPING_TLS_FAST mapping_live_memo add_memo; /* the batch last added to */

static mapping_status check_copy(const char *fn, mapping_batch *b, const void *host, const char *host_name,
                                 const mapping_buffer *buf, const char *buf_name, size_t offset, size_t bytes)
{
    uint64_t removals = mapping__handle_removals_any(); /* before the lookups it vouches for */
    mapping_status st;
    if (!mapping__handle_live_memo(&add_memo, MAPPING_HANDLE_BATCH, b, removals) && (st = batch_lookup(fn, b)))
        return st; /* batch_lookup names the failure */
    bool unchanged = removals == b->checked_removals; /* its device and checked_buf are still live */
    if ((st = batch_check_rest(fn, b, unchanged)) || (st = mapping__check_ptr(fn, host_name, host)))
        return st;
    if (!unchanged || !buf || buf != b->checked_buf) {
        if ((st = mapping__check_buffer(fn, buf_name, buf)))
            return st;
        if (buf->dev != b->dev)
            return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH, "%s: %s belongs to another device than the batch", fn,
                                 buf_name);
    }
    if ((st = mapping__check_range(fn, buf_name, offset, bytes, buf->size)))
        return st;
    b->checked_removals = removals;
    b->checked_buf = buf;
    return MAPPING_OK;
}

/* The adds under either name: fn names the one the caller used. */
static mapping_status add_to_gpu(const char *fn, mapping_batch *b, const void *cpu_src, mapping_buffer *gpu_dst,
                                 size_t gpu_offset, size_t bytes)
{
    mapping_status st = check_copy(fn, b, cpu_src, "cpu_src", gpu_dst, "gpu_dst", gpu_offset, bytes);
    if (st)
        return st;
    return push(b, gpu_dst, gpu_offset, bytes, cpu_src, true);
}

static mapping_status add_to_cpu(const char *fn, mapping_batch *b, const mapping_buffer *gpu_src, size_t gpu_offset,
                                 void *cpu_dst, size_t bytes)
{
    mapping_status st = check_copy(fn, b, cpu_dst, "cpu_dst", gpu_src, "gpu_src", gpu_offset, bytes);
    if (st)
        return st;
    /* The buffer is only read; the cast keeps one copy record for both directions. */
    return push(b, (mapping_buffer *)(uintptr_t)gpu_src, gpu_offset, bytes, cpu_dst, false);
}

mapping_status mapping_batch_add_to_gpu(mapping_batch *b, const void *cpu_src, mapping_buffer *gpu_dst,
                                        size_t gpu_offset, size_t bytes)
{
    return add_to_gpu("mapping_batch_add_to_gpu", b, cpu_src, gpu_dst, gpu_offset, bytes);
}

mapping_status mapping_batch_add_to_cpu(mapping_batch *b, const mapping_buffer *gpu_src, size_t gpu_offset,
                                        void *cpu_dst, size_t bytes)
{
    return add_to_cpu("mapping_batch_add_to_cpu", b, gpu_src, gpu_offset, cpu_dst, bytes);
}

/* The earlier names (deprecated): real functions, so that programs built
 * against them still find the symbols in libmapping.so. */
mapping_status mapping_batch_sync_to_gpu(mapping_batch *b, const void *cpu_src, mapping_buffer *gpu_dst,
                                         size_t gpu_offset, size_t bytes)
{
    return add_to_gpu("mapping_batch_sync_to_gpu", b, cpu_src, gpu_dst, gpu_offset, bytes);
}

mapping_status mapping_batch_sync_to_cpu(mapping_batch *b, const mapping_buffer *gpu_src, size_t gpu_offset,
                                         void *cpu_dst, size_t bytes)
{
    return add_to_cpu("mapping_batch_sync_to_cpu", b, gpu_src, gpu_offset, cpu_dst, bytes);
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
