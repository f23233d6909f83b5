/*
 * Access intents: acquire a side of a mirror for reading, writing or both;
 * the library syncs before a read and marks after a write. Write-only access
 * to a whole view discards: nothing is copied.
 */
#include "coherence/mirror_api.h"
#include "coherence/mirror_queue.h"

static mapping_status check_access(const char *fn, unsigned access)
{
    if (access == 0 || (access & ~(unsigned)(MAPPING_READ | MAPPING_WRITE)))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: access 0x%x is not a non-empty combination of MAPPING_READ | MAPPING_WRITE", fn,
                             access);
    return MAPPING_OK;
}

static mapping_status acquire_cpu_entered(const char *fn, mapping_mirror *m, unsigned access, void **ptr)
{
    mirror_state *st = m->st;
    size_t lo = m->offset, hi = lo + m->size;
    mapping_status status;
    if ((access & MAPPING_READ) && (status = mapping__mirror_sync_checked(fn, NULL, m, MIRROR_CPU)))
        return status;
    /* Unified memory: device work on the native queue may still touch it. */
    if (st->unified && !(access & MAPPING_READ) && (status = mapping__device_synchronize(st->dev)))
        return status;
    /* Nothing queued may still read or write these host bytes. */
    if ((status = mapping__mirror_order(st, NULL, lo, hi, MIRROR_ACCESS)))
        return status;
    if ((access & MAPPING_WRITE) &&
        (status = mapping__mirror_mark(fn, st, MIRROR_CPU, lo, hi, !(access & MAPPING_READ))))
        return status;
    *ptr = st->cpu + lo;
    return MAPPING_OK;
}

mapping_status mapping_mirror_acquire_cpu(mapping_mirror *m, unsigned access, void **ptr)
{
    static const char fn[] = "mapping_mirror_acquire_cpu";
    mapping_status status;
    if ((status = mapping__mirror_check(fn, m)) || (status = mapping__check_ptr(fn, "ptr", ptr)) ||
        (status = check_access(fn, access)))
        return status;
    *ptr = NULL;
    mirror_state *st = m->st;
    if ((status = mapping__mirror_refuse_capture(fn, st->dev, NULL)) ||
        (status = mapping__mirror_enter_fast(fn, st, false)))
        return status;
    status = acquire_cpu_entered(fn, m, access, ptr);
    mapping__mirror_leave_fast(st);
    return status;
}

static mapping_status acquire_gpu_entered(const char *fn, mapping_stream *stream, mapping_mirror *m, unsigned access,
                                          mapping_buffer **buf)
{
    mirror_state *st = m->st;
    size_t lo = m->offset, hi = lo + m->size;
    mapping_status status;
    /* The device side must exist (made again after an eviction). */
    if (st->n_features && (status = mapping__mirror_hook_device_use(fn, st, MIRROR_USE_ACQUIRE)))
        return status;
    if ((access & MAPPING_READ) && (status = mapping__mirror_sync_checked(fn, stream, m, MIRROR_GPU)))
        return status;
    /* The caller's device work comes after everything queued on these bytes.
     * Copies to the CPU still reading them are waited for when we write:
     * their completion would otherwise fold over our fresh modification. */
    if ((status = mapping__mirror_order(st, stream, lo, hi, (access & MAPPING_WRITE) ? MIRROR_CPU : MIRROR_ACCESS)))
        return status;
    if ((access & MAPPING_WRITE) &&
        (status = mapping__mirror_mark(fn, st, MIRROR_GPU, lo, hi, !(access & MAPPING_READ))))
        return status;
    st->acquired++; /* held on the device until release_gpu: not evicted meanwhile */
    *buf = st->gpu;
    return MAPPING_OK;
}

mapping_status mapping_mirror_acquire_gpu(mapping_stream *stream, mapping_mirror *m, unsigned access,
                                          mapping_buffer **buf)
{
    static const char fn[] = "mapping_mirror_acquire_gpu";
    mapping_status status;
    if ((status = mapping__mirror_check(fn, m)) || (status = mapping__check_stream(fn, stream)) ||
        (status = mapping__check_ptr(fn, "buf", buf)) || (status = check_access(fn, access)))
        return status;
    *buf = NULL;
    mirror_state *st = m->st;
    if ((status = mapping__check_same_device(fn, st->dev, stream)) ||
        (status = mapping__mirror_refuse_capture(fn, st->dev, stream)) ||
        (status = mapping__mirror_enter_fast(fn, st, (access & MAPPING_READ) != 0)))
        return status;
    status = acquire_gpu_entered(fn, stream, m, access, buf);
    mapping__mirror_leave_fast(st);
    return status;
}

mapping_status mapping_mirror_release_gpu(mapping_stream *stream, mapping_mirror *m)
{
    static const char fn[] = "mapping_mirror_release_gpu";
    mapping_status status;
    if ((status = mapping__mirror_check(fn, m)) || (status = mapping__check_stream(fn, stream)) ||
        (status = mapping__check_same_device(fn, m->st->dev, stream)) ||
        (status = mapping__mirror_refuse_capture(fn, m->st->dev, stream)) ||
        (status = mapping__mirror_enter_fast(fn, m->st, false)))
        return status;
    /* NULL: the caller's work went to the device's native queue (or was
     * blocking): wait for that queue, so that every later call, a unified
     * mirror's CPU side included, sees the work done. Queued: later calls
     * (and an eviction) order after it. */
    status = !stream ? mapping__device_synchronize(m->st->dev)
                     : mapping__mirror_queue_access(&m->st->queue, stream, m->offset, m->offset + m->size);
    if (status == MAPPING_OK)
        m->st->acquired -= m->st->acquired > 0;
    mapping__mirror_leave_fast(m->st);
    return status;
}
