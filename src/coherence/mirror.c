/* Mirrors as objects: creation, views, lifetimes and the getters. */
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_api.h"
#include "coherence/mirror_features.h"
#include "os/os.h"

/* Its device was closed first and took the buffers, events and page-locked
 * memory with it: free what is the state's own host memory only. */
static void state_forget(mirror_state *st)
{
    mapping__mirror_end_features(st, true); /* the watch goes first: the memory may be gone */
    if (st->batch)
        mapping__batch_forget(st->batch);
    mapping__mirror_state_free(st);
}

static void state_free(mirror_state *st)
{
    mapping__mirror_resident_retire(st, false); /* no eviction may start or run from here on */
    bool left_to_close = mapping__mirror_drain(st) != MAPPING_OK;
    if (left_to_close) {
        /* A queued copy may still read or write the memory: rather than free
         * it under the copy, leave it to mapping_close (it frees what a
         * device still holds). */
        mapping__log(0, "mapping_mirror_destroy: a queued copy could not be waited for: %s; the mirror's memory "
                        "is left to mapping_close", mapping__last_message());
        st->gpu = NULL;
        st->owns_cpu = false;
        st->pinned = false;
    }
    mapping__mirror_end_features(st, left_to_close); /* before the memory goes */
    if (st->batch)
        mapping__batch_destroy(st->batch);
    if (st->gpu && !st->borrowed_gpu)
        mapping__free_gpu(st->gpu); /* unified: this frees st->cpu too */
    if (st->owns_cpu && st->cpu_alloc)
        mapping__free_cpu(st->dev, st->cpu_alloc);
    if (st->pinned)
        mapping__host_unregister(st->dev, st->cpu);
    mapping__mirror_state_free(st);
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

static mapping_status check_create_args(const char *fn, mapping_device *dev, size_t bytes, unsigned flags,
                                        mapping_mirror **out)
{
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    if (bytes == 0)
        return mapping__fail(MAPPING_ERR_ZERO_SIZE, "%s: bytes is 0", fn);
    if (flags & ~(unsigned)MIRROR_CREATE_FLAGS)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: unknown flags 0x%x", fn,
                             flags & ~(unsigned)MIRROR_CREATE_FLAGS);
    return MAPPING_OK;
}

/* The features the flags ask for (and MAPPING_CHECK's; residency on a
 * device with a memory budget, for a device side of the library's own),
 * then the handle. Residency puts the family on the device's list, where
 * an allocation on another thread may evict it at once: it is begun with
 * the family's lock held, let go when the family is whole (a feature added
 * after it would otherwise change the table under that eviction). */
static mapping_status finish_family(const char *fn, mirror_state *st, unsigned flags, mapping_mirror **out)
{
    mapping_status status;
    bool evictable = atomic_load(&st->dev->budget) && !st->unified && !st->borrowed_gpu;
    if (((flags & MAPPING_MIRROR_TRACK_WRITES) && (status = mapping__mirror_track_begin(fn, st))) ||
        ((flags & MAPPING_MIRROR_DEVICE_DIFF) && (status = mapping__mirror_diff_begin(fn, st))) ||
        (evictable && (status = mapping__mirror_resident_begin(fn, st, true))))
        return status;
    if ((status = handle_new(fn, st, 0, st->size, out)) == MAPPING_OK)
        mapping__mirror_check_begin(st);
    if (st->resident)
        mapping__mirror_resident_unlock(st);
    return status;
}

/* The two sides of a created mirror: unified memory where asked and
 * possible, else a device buffer and page-locked host memory (whole pages
 * when tracked: no other data may share a watched page). */
static mapping_status create_sides(const char *fn, mirror_state *st, size_t bytes, unsigned flags)
{
    mapping_error_mark before;
    mapping__error_mark(&before);
    if ((flags & MAPPING_MIRROR_UNIFIED) && mapping__mirror_unified_begin(st) == MAPPING_OK)
        return MAPPING_OK;
    mapping__error_forget(&before); /* no unified memory: an ordinary mirror, and no error */
    bool tracked = (flags & MAPPING_MIRROR_TRACK_WRITES) != 0;
    size_t cpu_bytes = tracked ? mapping__mirror_track_alloc_bytes(bytes) : bytes, page = mapping_os_page_size();
    void *cpu = NULL;
    mapping_status status;
    if ((status = mapping__allocate_gpu_counted(fn, st->dev, bytes, &st->gpu)) ||
        (status = mapping__allocate_cpu(st->dev, cpu_bytes, &cpu)))
        return status;
    if (tracked && (uintptr_t)cpu % page) { /* not on a page (a heap block): a page more, and start on one */
        mapping__free_cpu(st->dev, cpu);
        if ((status = mapping__allocate_cpu(st->dev, cpu_bytes + page, &cpu)))
            return status;
    }
    st->cpu_alloc = cpu;
    st->cpu = tracked ? (unsigned char *)(((uintptr_t)cpu + page - 1) & ~(uintptr_t)(page - 1)) : cpu;
    st->cpu_bytes = cpu_bytes;
    st->owns_cpu = true;
    return MAPPING_OK;
}

mapping_status mapping_mirror_create(mapping_device *dev, size_t bytes, unsigned flags, mapping_mirror **out)
{
    static const char fn[] = "mapping_mirror_create";
    mapping_status status = check_create_args(fn, dev, bytes, flags, out);
    mirror_state *st = NULL;
    mapping__mirror_reap(); /* families CUDA graphs gave up: their memory first */
    if (status || (status = mapping__mirror_state_new(fn, dev, bytes, &st)))
        return status;
    if ((status = create_sides(fn, st, bytes, flags)) == MAPPING_OK) {
        memset(st->cpu, 0, st->owns_cpu ? st->cpu_bytes : bytes);
        st->gpu->owner = "mirror"; /* the public free refuses it: the mirror would use it after */
        if ((status = finish_family(fn, st, flags, out)) == MAPPING_OK)
            return MAPPING_OK;
    }
    state_free(st);
    return status;
}

mapping_status mapping__mirror_wrap(const char *fn, mapping_device *dev, void *cpu_ptr, size_t bytes, unsigned flags,
                                    mapping_mirror **out)
{
    mirror_state *st = NULL;
    mapping_status status;
    if ((status = mapping__mirror_state_new(fn, dev, bytes, &st)))
        return status;
    st->cpu = cpu_ptr;
    /* Pinning is an optimisation: a back end that cannot is not an error. */
    if ((flags & MAPPING_MIRROR_PIN) && mapping__host_register(dev, cpu_ptr, bytes) == MAPPING_OK)
        st->pinned = true;
    if ((status = mapping__allocate_gpu_counted(fn, dev, bytes, &st->gpu)) == MAPPING_OK) {
        st->gpu->owner = "mirror"; /* the public free refuses it: the mirror would use it after */
        status = finish_family(fn, st, flags, out);
    }
    if (status != MAPPING_OK)
        state_free(st);
    return status;
}

mapping_status mapping_mirror_wrap(mapping_device *dev, void *cpu_ptr, size_t bytes, unsigned flags,
                                   mapping_mirror **out)
{
    static const char fn[] = "mapping_mirror_wrap";
    mapping_status status = check_create_args(fn, dev, bytes, flags, out);
    if (status || (status = mapping__check_ptr(fn, "cpu_ptr", cpu_ptr)))
        return status;
    if ((uintptr_t)cpu_ptr + bytes < (uintptr_t)cpu_ptr)
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "%s: cpu_ptr %p + %zu bytes wraps around", fn, cpu_ptr, bytes);
    return mapping__mirror_wrap(fn, dev, cpu_ptr, bytes, flags, out);
}

static mapping_status check_adopt_args(const char *fn, mapping_device *dev, void *cpu_ptr, mapping_buffer *gpu,
                                       size_t gpu_offset, size_t bytes, unsigned flags, mapping_mirror **out)
{
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
    return MAPPING_OK;
}

mapping_status mapping_mirror_adopt(mapping_device *dev, void *cpu_ptr, mapping_buffer *gpu, size_t gpu_offset,
                                    size_t bytes, unsigned flags, mapping_mirror **out)
{
    static const char fn[] = "mapping_mirror_adopt";
    mapping_status status = check_adopt_args(fn, dev, cpu_ptr, gpu, gpu_offset, bytes, flags, out);
    mirror_state *st = NULL;
    if (status || (status = mapping__mirror_state_new(fn, dev, bytes, &st)))
        return status;
    st->cpu = cpu_ptr;
    st->gpu = gpu;
    st->gpu_base = gpu_offset;
    st->borrowed_gpu = true;
    /* the device side holds the data: the CPU side is stale */
    if (!(flags & MAPPING_MIRROR_GPU_VALID) || (status = mapping__mirror_state_gpu_valid(st)) == MAPPING_OK) {
        if ((flags & MAPPING_MIRROR_PIN) && mapping__host_register(dev, cpu_ptr, bytes) == MAPPING_OK)
            st->pinned = true;
        status = finish_family(fn, st, flags, out);
    }
    if (status != MAPPING_OK)
        state_free(st);
    return status;
}

void mapping__mirror_family_release(mirror_state *st)
{
    if (--st->refs == 0)
        (mapping__device_alive(st->dev, st->dev_serial) ? state_free : state_forget)(st);
}

void mapping_mirror_destroy(mapping_mirror *m)
{
    if (!m)
        return;
    mapping__mirror_reap(); /* families CUDA graphs gave up */
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
    if ((st = mapping__check_range(fn, "view", offset, bytes, parent->size)) ||
        (st = mapping__mirror_enter_fast(fn, parent->st, false)))
        return st;
    st = handle_new(fn, parent->st, parent->offset + offset, bytes, out);
    mapping__mirror_leave_fast(parent->st);
    return st;
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
    if (!mirror_readable(m))
        return NULL;
    return m->st->resident ? mapping__mirror_resident_gpu(m->st) : m->st->gpu;
}

int mapping_mirror_is_resident(const mapping_mirror *m)
{
    return mirror_readable(m) && mapping__mirror_resident_is(m->st);
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
