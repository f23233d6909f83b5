/*
 * Small allocations without the driver: a region of device memory and one of
 * page-locked host memory, made when the device opens, from which requests of
 * up to CUDA_POOL_MAX_BYTES (batch staging, small buffers) are carved in
 * 4 KiB units, first fit. A real driver may synchronize an allocation, and
 * does synchronize a free, with every stream: a batch's first flush, run
 * while the caller's stream waits for the caller, would hang if its staging
 * came from cuMemAlloc / cuMemHostAlloc. Larger requests, and small ones
 * when a region is full, go to the driver as before.
 */
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_device.h"
#include "os/os.h"


bool mapping__cuda_suballoc_init(cuda_suballoc *a, uintptr_t base, size_t bytes)
{
    memset(a, 0, sizeof *a);
    size_t units = bytes / CUDA_POOL_UNIT;
    a->used = mapping_os_calloc((units + 63) / 64, sizeof *a->used);
    a->length = mapping_os_calloc(units ? units : 1, sizeof *a->length);
    if (!a->used || !a->length) {
        free(a->used);
        free(a->length);
        memset(a, 0, sizeof *a);
        return false;
    }
    pthread_mutex_init(&a->lock, NULL);
    a->base = base;
    a->units = units;
    return true;
}

void mapping__cuda_suballoc_destroy(cuda_suballoc *a)
{
    if (a->used)
        pthread_mutex_destroy(&a->lock);
    free(a->used);
    free(a->length);
    memset(a, 0, sizeof *a);
}

static bool unit_used(const cuda_suballoc *a, size_t u)
{
    return (a->used[u / 64] >> (u % 64)) & 1;
}

static void mark(cuda_suballoc *a, size_t first, size_t n, bool used)
{
    for (size_t u = first; u < first + n; u++) {
        if (used)
            a->used[u / 64] |= (uint64_t)1 << (u % 64);
        else
            a->used[u / 64] &= ~((uint64_t)1 << (u % 64));
    }
}

bool mapping__cuda_suballoc_take(cuda_suballoc *a, size_t bytes, uintptr_t *out)
{
    if (!a->units || bytes == 0 || bytes > CUDA_POOL_MAX_BYTES)
        return false;
    size_t n = (bytes + CUDA_POOL_UNIT - 1) / CUDA_POOL_UNIT;
    bool found = false;
    pthread_mutex_lock(&a->lock);
    for (size_t start = 0, run = 0, u = 0; u < a->units; u++) {
        if (unit_used(a, u)) {
            run = 0;
            start = u + 1;
            continue;
        }
        if (++run == n) {
            mark(a, start, n, true);
            a->length[start] = (uint32_t)n;
            *out = a->base + start * CUDA_POOL_UNIT;
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&a->lock);
    return found;
}

bool mapping__cuda_suballoc_give(cuda_suballoc *a, uintptr_t p)
{
    if (!a->units || p < a->base || p >= a->base + a->units * CUDA_POOL_UNIT)
        return false;
    size_t start = (p - a->base) / CUDA_POOL_UNIT;
    pthread_mutex_lock(&a->lock);
    mark(a, start, a->length[start], false);
    a->length[start] = 0;
    pthread_mutex_unlock(&a->lock);
    return true;
}

/* ---- the two regions of a device ---- */

static const size_t POOL_DEVICE_BYTES = (size_t)16 << 20;
static const size_t POOL_HOST_BYTES = (size_t)8 << 20;

void mapping__cuda_pools_init(cuda_device *d)
{
    const cuda_driver *cu = d->cu;
    cu_deviceptr dev = 0;
    if (cu->cuMemAlloc_v2(&dev, POOL_DEVICE_BYTES) == CU_SUCCESS) {
        if (mapping__cuda_suballoc_init(&d->device_pool, (uintptr_t)dev, POOL_DEVICE_BYTES))
            d->device_pool_mem = dev;
        else
            cu->cuMemFree_v2(dev);
    }
    /* One unit more, so that the region can start on a page boundary (a
     * page-aligned mapping_allocate_cpu block needs it). */
    void *host = NULL;
    if (cu->cuMemHostAlloc(&host, POOL_HOST_BYTES + CUDA_POOL_UNIT, CU_MEMHOSTALLOC_PORTABLE_) == CU_SUCCESS) {
        uintptr_t aligned = ((uintptr_t)host + CUDA_POOL_UNIT - 1) / CUDA_POOL_UNIT * CUDA_POOL_UNIT;
        if (mapping__cuda_suballoc_init(&d->host_pool, aligned, POOL_HOST_BYTES))
            d->host_pool_mem = host;
        else
            cu->cuMemFreeHost(host);
    }
}

void mapping__cuda_pools_destroy(cuda_device *d)
{
    mapping__cuda_suballoc_destroy(&d->device_pool);
    mapping__cuda_suballoc_destroy(&d->host_pool);
    if (d->device_pool_mem)
        d->cu->cuMemFree_v2(d->device_pool_mem);
    if (d->host_pool_mem)
        d->cu->cuMemFreeHost(d->host_pool_mem);
    d->device_pool_mem = 0;
    d->host_pool_mem = NULL;
}
