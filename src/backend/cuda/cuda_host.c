/*
 * Page-locked host memory the library did not make: torch.Tensor.pin_memory,
 * CuPy's pinned memory pool, cudaHostAlloc or cudaHostRegister by another
 * library. The core's registry knows only the library's own page-locked
 * memory, so such memory used to be staged like pageable memory (two CPU
 * copies, 0.43-0.55x of page-locked speed on an H200). Where a copy would
 * be staged, the driver is asked (cuPointerGetAttribute: memory type, the
 * range and the context) whether the host side is page-locked for this
 * context; if so the copy is a DMA from it, as from the library's own.
 *
 * The answer is cached per range (the allocation or registration the driver
 * names), in a small table replaced least recently used first. A range is
 * asked again once its answer is older than LOCKED_RECHECK_SECONDS: memory
 * another library frees can come back as pageable memory at the same
 * address, and a DMA the driver takes for page-locked must not read it (a
 * cuMemcpyDtoHAsync into pageable memory would wait for the stream). Only
 * positive answers are kept: pageable memory is asked about each time a copy
 * of it would be staged (one driver call, against a memcpy and a host
 * function for the staging).
 */
#include <string.h>
#include "backend/cuda/cuda_device.h"
#include "os/os.h"

static const double LOCKED_RECHECK_SECONDS = 0.25;

void mapping__cuda_locked_init(cuda_device *d)
{
    memset(&d->locked, 0, sizeof d->locked);
    pthread_mutex_init(&d->locked.lock, NULL);
}

void mapping__cuda_locked_destroy(cuda_device *d)
{
    pthread_mutex_destroy(&d->locked.lock);
}

/* A fresh cached range holding [a, a + n)? */
static bool cached(cuda_device *d, uintptr_t a, size_t n, double now)
{
    cuda_locked_cache *c = &d->locked;
    bool hit = false;
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < CUDA_LOCKED_RANGES && !hit; i++)
        if (c->range[i].end && c->range[i].start <= a && a + n <= c->range[i].end &&
            now - c->range[i].checked < LOCKED_RECHECK_SECONDS) {
            c->range[i].used = ++c->clock;
            hit = true;
        }
    pthread_mutex_unlock(&c->lock);
    return hit;
}

/* Keeps [start, end) as page-locked, in place of the same range or of the
 * least recently used one. */
static void remember(cuda_device *d, uintptr_t start, uintptr_t end, double now)
{
    cuda_locked_cache *c = &d->locked;
    pthread_mutex_lock(&c->lock);
    int slot = 0;
    for (int i = 0; i < CUDA_LOCKED_RANGES; i++) {
        if (c->range[i].start == start && c->range[i].end == end) {
            slot = i;
            break;
        }
        if (c->range[i].used < c->range[slot].used)
            slot = i;
    }
    c->range[slot].start = start;
    c->range[slot].end = end;
    c->range[slot].checked = now;
    c->range[slot].used = ++c->clock;
    pthread_mutex_unlock(&c->lock);
}

/* Page-locked for this context: allocated or registered in it, or portable. */
static bool ours_to_use(cuda_device *d, const void *p)
{
    const cuda_driver *cu = d->cu;
    cu_context ctx = NULL;
    unsigned flags = 0;
    if (cu->cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT_, (cu_deviceptr)(uintptr_t)p) == CU_SUCCESS &&
        ctx == d->ctx)
        return true;
    return cu->cuMemHostGetFlags && cu->cuMemHostGetFlags(&flags, (void *)(uintptr_t)p) == CU_SUCCESS &&
           (flags & CU_MEMHOSTALLOC_PORTABLE_);
}

bool mapping__cuda_host_locked(cuda_device *d, const void *p, size_t bytes)
{
    const cuda_driver *cu = d->cu;
    uintptr_t a = (uintptr_t)p;
    if (!cu->cuPointerGetAttribute || bytes == 0 || a + bytes < a)
        return false;
    double now = mapping_os_now();
    if (cached(d, a, bytes, now))
        return true;
    unsigned type = 0;
    cu_deviceptr start = 0;
    size_t size = 0;
    cu_deviceptr ptr = (cu_deviceptr)a;
    if (cu->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE_, ptr) != CU_SUCCESS ||
        type != CU_MEMORYTYPE_HOST_ || !ours_to_use(d, p))
        return false; /* pageable memory (the driver knows nothing of it), or device memory */
    if (cu->cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR_, ptr) != CU_SUCCESS ||
        cu->cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE_, ptr) != CU_SUCCESS)
        return false; /* cannot tell where it ends: stage, as before */
    if (start > a || a + bytes > start + size)
        return false; /* the copy runs past the page-locked block */
    remember(d, (uintptr_t)start, (uintptr_t)(start + size), now);
    return true;
}

bool mapping__cuda_host_locked_op(void *dev, const void *p, size_t bytes)
{
    cuda_device *d = dev;
    bool locked = false;
    mapping_status st;
    IN_CONTEXT(d, locked = mapping__cuda_host_locked(d, p, bytes));
    (void)st;
    return locked;
}
