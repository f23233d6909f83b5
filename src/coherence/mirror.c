/* Mirrors: creation, views, lifetimes, marking and conflicts. */
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_internal.h"
#include "coherence/mirror_observe.h"

/* The mirror this thread last checked (a loop of marks checks the same one). */
static _Thread_local MAPPING_TLS_FAST mapping_live_memo check_memo;

mapping_status mapping__mirror_check(const char *fn, const mapping_mirror *m)
{
    uint64_t removals = mapping__handle_removals_any(); /* before the lookups it vouches for */
    if (!m)
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: mirror is NULL", fn);
    if (!mapping__handle_live_memo(&check_memo, MAPPING_HANDLE_MIRROR, m, removals))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: mirror %p is not a live mirror", fn, (const void *)m);
    if (removals != m->st->dev_checked_removals) {
        if (!mapping__device_alive(m->st->dev, m->st->dev_serial))
            return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: the device of mirror %p was closed before it", fn,
                                 (const void *)m);
        m->st->dev_checked_removals = removals;
    }
    if (m->st->busy)
        return mapping__fail(MAPPING_ERR_BUSY, "%s: mirror %p's family is being synced (called from a callback of "
                                               "that sync)", fn, (const void *)m);
    return MAPPING_OK;
}

/* What the state holds in host memory of its own: the unmarked-write
 * check's hashes, the mark log, queued entries and the range sets. */
static void state_free_host_parts(mirror_state *st)
{
    mapping__mirror_check_forget(st);
    mapping__mirror_log_free(st);
    for (size_t i = 0; i < st->n_inflight; i++)
        free(st->inflight[i].ranges);
    free(st->inflight);
    for (int s = 0; s < 2; s++) {
        mapping__rs_free(&st->stale[s]);
        mapping__rs_free(&st->modified[s]);
        mapping__rs_free(&st->pending[s]);
    }
}

/* Its device was closed first and took the buffers, events and page-locked
 * memory with it: free what is the state's own host memory only. */
static void state_forget(mirror_state *st)
{
    mapping__mirror_track_end(st); /* the watch goes first: the memory may be gone */
    mapping__mirror_diff_end(st, true);
    if (st->batch)
        mapping__batch_forget(st->batch);
    state_free_host_parts(st);
    free(st);
}

static void state_free(mirror_state *st)
{
    if (mapping__mirror_drain(st) != MAPPING_OK) {
        /* A queued copy may still read or write the memory: rather than free
         * it under the copy, leave it to mapping_close (it frees what a
         * device still holds). */
        mapping__log(0, "mapping_mirror_destroy: a queued copy could not be waited for: %s; the mirror's memory "
                        "is left to mapping_close", mapping__last_message());
        st->gpu = NULL;
        st->owns_cpu = false;
        st->pinned = false;
    }
    mapping__mirror_track_end(st); /* before the memory goes (no-op when not tracked) */
    mapping__mirror_check_forget(st); /* MAPPING_CHECK=unmarked's watch too */
    mapping__mirror_diff_end(st, st->gpu == NULL); /* its buffers too, unless left to mapping_close */
    if (st->batch)
        mapping__batch_destroy(st->batch);
    if (st->gpu && !st->borrowed_gpu)
        mapping__free_gpu(st->gpu); /* unified: this frees st->cpu too */
    if (st->owns_cpu && st->cpu)
        mapping__free_cpu(st->dev, st->cpu);
    if (st->pinned)
        mapping__host_unregister(st->dev, st->cpu);
    state_free_host_parts(st);
    free(st);
}

static mapping_status handle_new(const char *fn, mirror_state *st, size_t offset, size_t size, mapping_mirror **out)
{
    mapping_mirror *m = mapping_os_handle_alloc(sizeof *m); /* see os/handle_arena.c */
    if (!m || mapping__handle_add(MAPPING_HANDLE_MIRROR, m) != MAPPING_OK) {
        mapping_os_handle_free(m);
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    }
    m->st = st;
    m->offset = offset;
    m->size = size;
    st->refs++;
    *out = m;
    return MAPPING_OK;
}

/* A new state: CPU valid everywhere, GPU stale everywhere. */
static mapping_status state_new(const char *fn, mapping_device *dev, size_t bytes, mirror_state **out)
{
    mirror_state *st = mapping_os_calloc(1, sizeof *st);
    if (!st)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    st->dev = dev;
    st->dev_serial = dev->serial;
    st->size = bytes;
    for (int s = 0; s < 2; s++) {
        mapping__rs_init(&st->stale[s]);
        mapping__rs_init(&st->modified[s]);
        mapping__rs_init(&st->pending[s]);
    }
    mapping_status status = mapping__rs_add(&st->stale[MIRROR_GPU], 0, bytes);
    if (status != MAPPING_OK) {
        free(st);
        return status;
    }
    *out = st;
    return MAPPING_OK;
}

static mapping_status check_create_args(const char *fn, mapping_device *dev, size_t bytes, unsigned flags,
                                        mapping_mirror **out)
{
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    if (bytes == 0)
        return mapping__fail(MAPPING_ERR_ZERO_SIZE, "%s: bytes is 0", fn);
    const unsigned known =
        MAPPING_MIRROR_UNIFIED | MAPPING_MIRROR_PIN | MAPPING_MIRROR_TRACK_WRITES | MAPPING_MIRROR_DEVICE_DIFF;
    if (flags & ~known)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: unknown flags 0x%x", fn, flags & ~known);
    return MAPPING_OK;
}

mapping_status mapping_mirror_create(mapping_device *dev, size_t bytes, unsigned flags, mapping_mirror **out)
{
    static const char fn[] = "mapping_mirror_create";
    mapping_status status = check_create_args(fn, dev, bytes, flags, out);
    mirror_state *st = NULL;
    if (status || (status = state_new(fn, dev, bytes, &st)))
        return status;
    mapping_error_mark before;
    mapping__error_mark(&before);
    if (!(flags & MAPPING_MIRROR_UNIFIED) || mapping__mirror_alloc_unified(st) != MAPPING_OK) {
        mapping__error_forget(&before); /* no unified memory: an ordinary mirror, and no error */
        void *cpu = NULL;
        if ((status = mapping__allocate_gpu(dev, bytes, &st->gpu)) ||
            (status = mapping__allocate_cpu(dev, bytes, &cpu)))
            goto fail;
        st->cpu = cpu;
        st->owns_cpu = true;
    }
    memset(st->cpu, 0, bytes);
    st->gpu->owner = "mirror"; /* the public free refuses it: the mirror would use it after */
    if ((flags & MAPPING_MIRROR_TRACK_WRITES) && (status = mapping__mirror_track_begin(fn, st)))
        goto fail;
    if ((flags & MAPPING_MIRROR_DEVICE_DIFF) && (status = mapping__mirror_diff_begin(fn, st)))
        goto fail;
    if ((status = handle_new(fn, st, 0, bytes, out)) == MAPPING_OK)
        return MAPPING_OK;
fail:
    state_free(st);
    return status;
}

mapping_status mapping_mirror_wrap(mapping_device *dev, void *cpu_ptr, size_t bytes, unsigned flags,
                                   mapping_mirror **out)
{
    static const char fn[] = "mapping_mirror_wrap";
    mapping_status status = check_create_args(fn, dev, bytes, flags, out);
    mirror_state *st = NULL;
    if (status || (status = mapping__check_ptr(fn, "cpu_ptr", cpu_ptr)))
        return status;
    if ((uintptr_t)cpu_ptr + bytes < (uintptr_t)cpu_ptr)
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "%s: cpu_ptr %p + %zu bytes wraps around", fn, cpu_ptr, bytes);
    if ((status = state_new(fn, dev, bytes, &st)))
        return status;
    st->cpu = cpu_ptr;
    /* Pinning is an optimisation: a back end that cannot is not an error. */
    if ((flags & MAPPING_MIRROR_PIN) && mapping__host_register(dev, cpu_ptr, bytes) == MAPPING_OK)
        st->pinned = true;
    if ((status = mapping__allocate_gpu(dev, bytes, &st->gpu)) == MAPPING_OK)
        st->gpu->owner = "mirror"; /* the public free refuses it: the mirror would use it after */
    if (status ||
        ((flags & MAPPING_MIRROR_TRACK_WRITES) && (status = mapping__mirror_track_begin(fn, st))) ||
        ((flags & MAPPING_MIRROR_DEVICE_DIFF) && (status = mapping__mirror_diff_begin(fn, st))) ||
        (status = handle_new(fn, st, 0, bytes, out))) {
        state_free(st);
        return status;
    }
    return MAPPING_OK;
}

mapping_status mapping_mirror_adopt(mapping_device *dev, void *cpu_ptr, mapping_buffer *gpu, size_t gpu_offset,
                                    size_t bytes, unsigned flags, mapping_mirror **out)
{
    static const char fn[] = "mapping_mirror_adopt";
    mapping_status status;
    if ((status = mapping__check_device(fn, dev)) || (status = mapping__check_ptr(fn, "out", out)))
        return status;
    *out = NULL;
    if ((status = mapping__check_ptr(fn, "cpu_ptr", cpu_ptr)) || (status = mapping__check_buffer(fn, "gpu", gpu)) ||
        (status = mapping__check_range(fn, "gpu", gpu_offset, bytes, gpu->size)))
        return status;
    if (gpu->dev != dev)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH, "%s: the buffer belongs to another device", fn);
    const unsigned known =
        MAPPING_MIRROR_PIN | MAPPING_MIRROR_GPU_VALID | MAPPING_MIRROR_TRACK_WRITES | MAPPING_MIRROR_DEVICE_DIFF;
    if (flags & ~known)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: unknown flags 0x%x", fn, flags & ~known);
    if ((uintptr_t)cpu_ptr + bytes < (uintptr_t)cpu_ptr)
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "%s: cpu_ptr %p + %zu bytes wraps around", fn, cpu_ptr, bytes);
    mirror_state *st = NULL;
    if ((status = state_new(fn, dev, bytes, &st)))
        return status;
    st->cpu = cpu_ptr;
    st->gpu = gpu;
    st->gpu_base = gpu_offset;
    st->borrowed_gpu = true;
    if (flags & MAPPING_MIRROR_GPU_VALID) { /* the device side holds the data: the CPU side is stale */
        if ((status = mapping__rs_remove(&st->stale[MIRROR_GPU], 0, bytes)) ||
            (status = mapping__rs_add(&st->stale[MIRROR_CPU], 0, bytes))) {
            state_free(st);
            return status;
        }
    }
    if ((flags & MAPPING_MIRROR_PIN) && mapping__host_register(dev, cpu_ptr, bytes) == MAPPING_OK)
        st->pinned = true;
    if (((flags & MAPPING_MIRROR_TRACK_WRITES) && (status = mapping__mirror_track_begin(fn, st))) ||
        ((flags & MAPPING_MIRROR_DEVICE_DIFF) && (status = mapping__mirror_diff_begin(fn, st))) ||
        (status = handle_new(fn, st, 0, bytes, out))) {
        state_free(st);
        return status;
    }
    return MAPPING_OK;
}

void mapping_mirror_destroy(mapping_mirror *m)
{
    if (!m)
        return;
    mapping_status status = mapping__mirror_check("mapping_mirror_destroy", m);
    bool device_closed = status == MAPPING_ERR_INVALID_HANDLE && mapping__handle_live(MAPPING_HANDLE_MIRROR, m);
    if ((status != MAPPING_OK && !device_closed) || !mapping__handle_remove(MAPPING_HANDLE_MIRROR, m))
        return;
    mirror_state *st = m->st;
    mapping_os_handle_free(m);
    if (--st->refs == 0)
        (device_closed ? state_forget : state_free)(st); /* device closed: the error stays recorded */
}

mapping_status mapping_mirror_view(mapping_mirror *parent, size_t offset, size_t bytes, mapping_mirror **out)
{
    static const char fn[] = "mapping_mirror_view";
    mapping_status st;
    if ((st = mapping__mirror_check(fn, parent)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    if ((st = mapping__check_range(fn, "view", offset, bytes, parent->size)))
        return st;
    return handle_new(fn, parent->st, parent->offset + offset, bytes, out);
}

/* For the getters that return 0 / NULL on a bad handle: a live handle of an
 * open device (its buffer is gone with a closed device). */
static bool mirror_readable(const mapping_mirror *m)
{
    return mapping__handle_live(MAPPING_HANDLE_MIRROR, m) && mapping__device_alive(m->st->dev, m->st->dev_serial);
}

size_t mapping_mirror_size(const mapping_mirror *m)
{
    return mirror_readable(m) ? m->size : 0;
}

void *mapping_mirror_cpu(mapping_mirror *m)
{
    return mirror_readable(m) ? m->st->cpu + m->offset : NULL;
}

mapping_buffer *mapping_mirror_gpu(mapping_mirror *m)
{
    return mirror_readable(m) ? m->st->gpu : NULL;
}

size_t mapping_mirror_gpu_offset(const mapping_mirror *m)
{
    return mirror_readable(m) ? m->st->gpu_base + m->offset : 0;
}

int mapping_mirror_is_unified(const mapping_mirror *m)
{
    return mirror_readable(m) && m->st->unified;
}

int mapping_mirror_is_pinned(const mapping_mirror *m)
{
    return mirror_readable(m) && m->st->pinned;
}

int mapping_mirror_is_tracked(const mapping_mirror *m)
{
    return mirror_readable(m) && m->st->track != NULL;
}

/* Does [lo, hi) hold modifications of side y that are not already queued to
 * be copied to the other side? (Queued ones are synced: no conflict.) */
static bool has_unsynced_modification(const mirror_state *st, int y, size_t lo, size_t hi)
{
    const mapping_range_set *mod = &st->modified[y], *queued = &st->pending[1 - y];
    mapping_rs_cursor c;
    mapping_range r;
    for (bool ok = mapping__rs_seek(mod, lo, &c, &r); ok && r.lo < hi; ok = mapping__rs_next(&c, &r)) {
        size_t a = r.lo > lo ? r.lo : lo;
        size_t b = r.hi < hi ? r.hi : hi;
        if (mapping__rs_bytes_in(queued, a, b) != b - a)
            return true;
    }
    return false;
}

mapping_status mapping__mirror_mark(const char *fn, mirror_state *st, int x, size_t lo, size_t hi, bool discard)
{
    int y = 1 - x;
    mapping_status status;
    if ((status = mapping__mirror_log_flush(st)))
        return status;
    if (!discard && has_unsynced_modification(st, y, lo, hi)) {
        mapping__count(&st->dev->counters.conflicts, 1);
        return mapping__fail(MAPPING_ERR_CONFLICT,
                             "%s: [%zu, %zu) is also modified on the %s side and not synced; sync it first", fn, lo,
                             hi, y == MIRROR_CPU ? "CPU" : "GPU");
    }
    /* Reserve first: every change below then succeeds, so the mark is all or nothing. */
    if ((status = mapping__rs_reserve(&st->stale[y], 1)) || (status = mapping__rs_reserve(&st->modified[x], 1)) ||
        (status = mapping__rs_reserve(&st->stale[x], 1)) || (status = mapping__rs_reserve(&st->modified[y], 1)))
        return status;
    if (discard && x == MIRROR_GPU)
        mapping__mirror_diff_forget(st, lo, hi); /* the CPU's dropped writes differ from the shadow */
    if (discard)
        mapping__rs_remove(&st->modified[y], lo, hi);
    mapping__rs_add(&st->stale[y], lo, hi);
    mapping__rs_add(&st->modified[x], lo, hi);
    mapping__rs_remove(&st->stale[x], lo, hi);
    return MAPPING_OK;
}

static mapping_status mark_public(const char *fn, mapping_mirror *m, int x, size_t offset, size_t bytes)
{
    mapping_status status;
    if ((status = mapping__mirror_check(fn, m)) || (status = mapping__check_range(fn, "mirror", offset, bytes, m->size)))
        return status;
    mirror_state *st = m->st;
    size_t lo = m->offset + offset, hi = lo + bytes;
    if (st->n_inflight && (status = mapping__mirror_order(st, NULL, lo, hi, MIRROR_ACCESS)))
        return status;
    if (__builtin_expect(st->track != NULL, 0) && x == MIRROR_CPU)
        mapping__mirror_track_marked(st, lo, hi); /* mprotect mode: a system call may now write these pages */
    if (mapping__mirror_log_append(st, x, lo, hi))
        return MAPPING_OK;
    return mapping__mirror_mark(fn, st, x, lo, hi, false);
}

mapping_status mapping_mirror_mark_cpu_modified(mapping_mirror *m, size_t offset, size_t bytes)
{
    return mark_public("mapping_mirror_mark_cpu_modified", m, MIRROR_CPU, offset, bytes);
}

mapping_status mapping_mirror_mark_gpu_modified(mapping_mirror *m, size_t offset, size_t bytes)
{
    return mark_public("mapping_mirror_mark_gpu_modified", m, MIRROR_GPU, offset, bytes);
}

size_t mapping_mirror_stale_bytes(const mapping_mirror *m, mapping_side side)
{
    static const char fn[] = "mapping_mirror_stale_bytes";
    if (mapping__mirror_check(fn, m) != MAPPING_OK)
        return 0;
    if (side != MAPPING_CPU && side != MAPPING_GPU) {
        mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: side %d is neither MAPPING_CPU nor MAPPING_GPU", fn, (int)side);
        return 0;
    }
    mirror_state *st = m->st;
    size_t lo = m->offset, hi = lo + m->size;
    if (st->n_inflight)
        mapping__mirror_order(st, NULL, lo, hi, MIRROR_ACCESS);
    if (mapping__mirror_track_collect(fn, st, false) != MAPPING_OK || mapping__mirror_log_flush(st) != MAPPING_OK)
        return 0; /* out of memory, recorded */
    return mapping__rs_bytes_in(&st->stale[side - 1], lo, hi);
}
