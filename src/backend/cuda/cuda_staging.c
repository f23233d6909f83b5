/*
 * Asynchronous copies of pageable host memory. cuMemcpy*Async on pageable
 * memory "might be synchronous with respect to the host": to read into
 * pageable memory the driver waits until the stream reaches the copy, so a
 * stream held by earlier work (a host function waiting for the caller, say)
 * would hang the caller. The library promises that a call on a stream returns
 * once the work is queued, so the back end stages such copies itself through
 * page-locked blocks from a per-device pool:
 *   write: memcpy into a block now, cuMemcpyHtoDAsync from it, and a host
 *          function returns the block when the stream gets there;
 *   read:  cuMemcpyDtoHAsync into a block, then a host function copies it to
 *          the caller's memory and returns the block.
 * Blocks are never waited for: an empty pool allocates a new block. Idle
 * blocks beyond a small cache are freed from library calls (host functions
 * must not call the driver).
 */
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_device.h"
#include "os/os.h"
#include "os/status.h"

enum { STAGE_MIN_CLASS = 16 };                        /* 64 KiB */
static const size_t STAGE_CACHE_BYTES = (size_t)64 << 20; /* idle blocks kept */

void cuda_staging_init(cuda_staging *pool)
{
    memset(pool, 0, sizeof *pool);
    pthread_mutex_init(&pool->lock, NULL);
}

static int class_of(size_t bytes)
{
    int c = STAGE_MIN_CLASS;
    while (c < CUDA_STAGE_CLASSES - 1 && ((size_t)1 << c) < bytes)
        c++;
    return c;
}

cuda_stage_block *cuda_stage_get(cuda_device *d, size_t bytes, mapping_status *st)
{
    cuda_staging *pool = &d->staging;
    int c = class_of(bytes);
    pthread_mutex_lock(&pool->lock);
    cuda_stage_block *b = pool->free_blocks[c];
    if (b) {
        pool->free_blocks[c] = b->next;
        pool->free_bytes -= b->capacity;
    }
    pthread_mutex_unlock(&pool->lock);
    if (b)
        return b;
    b = mapping_os_calloc(1, sizeof *b);
    if (!b) {
        *st = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "cuda: out of memory");
        return NULL;
    }
    b->pool = pool;
    b->capacity = (size_t)1 << c;
    if (b->capacity < bytes) /* larger than the largest class: exact size */
        b->capacity = bytes;
    *st = cuda_check(d->cu->cuMemHostAlloc(&b->ptr, b->capacity, CU_MEMHOSTALLOC_PORTABLE_), "cuMemHostAlloc");
    if (*st != MAPPING_OK) {
        if (*st == MAPPING_ERR_OUT_OF_DEVICE_MEMORY)
            *st = MAPPING_ERR_OUT_OF_HOST_MEMORY;
        free(b);
        return NULL;
    }
    return b;
}

void cuda_stage_put(cuda_stage_block *b)
{
    cuda_staging *pool = b->pool;
    int c = class_of(b->capacity);
    pthread_mutex_lock(&pool->lock);
    b->next = pool->free_blocks[c];
    pool->free_blocks[c] = b;
    pool->free_bytes += b->capacity;
    pthread_mutex_unlock(&pool->lock);
}

/* Frees idle blocks down to `keep` bytes, largest first. */
static void trim_to(cuda_device *d, size_t keep)
{
    cuda_staging *pool = &d->staging;
    cuda_stage_block *doomed = NULL;
    pthread_mutex_lock(&pool->lock);
    for (int c = CUDA_STAGE_CLASSES - 1; c >= 0 && pool->free_bytes > keep; c--)
        while (pool->free_blocks[c] && pool->free_bytes > keep) {
            cuda_stage_block *b = pool->free_blocks[c];
            pool->free_blocks[c] = b->next;
            pool->free_bytes -= b->capacity;
            b->next = doomed;
            doomed = b;
        }
    pthread_mutex_unlock(&pool->lock);
    while (doomed) {
        cuda_stage_block *next = doomed->next;
        d->cu->cuMemFreeHost(doomed->ptr);
        free(doomed);
        doomed = next;
    }
}

void cuda_staging_trim(cuda_device *d)
{
    trim_to(d, STAGE_CACHE_BYTES);
}

void cuda_staging_destroy(cuda_device *d)
{
    trim_to(d, 0);
    pthread_mutex_destroy(&d->staging.lock);
}

/* ---- the two staged copies ---- */

static void write_done(void *arg)
{
    cuda_stage_put(arg);
}

static void read_done(void *arg)
{
    cuda_stage_block *b = arg;
    memcpy(b->copy_out, b->ptr, b->copy_out_bytes);
    cuda_stage_put(b);
}

/* After the copy is queued: queue `done`, or, if the driver refuses, wait
 * for the copy and run `done` here so the block is never lost in flight. */
static mapping_status queue_done(cuda_device *d, cu_stream s, cu_host_fn done, cuda_stage_block *b)
{
    if (d->cu->cuLaunchHostFunc(s, done, b) == CU_SUCCESS)
        return MAPPING_OK;
    mapping_status st = cuda_check(d->cu->cuStreamSynchronize(s), "cuStreamSynchronize");
    done(b);
    return st;
}

mapping_status cuda_staged_write(cuda_device *d, cu_stream s, const void *src, cu_deviceptr dst, size_t bytes)
{
    mapping_status st;
    cuda_stage_block *b = cuda_stage_get(d, bytes, &st);
    if (!b)
        return st;
    memcpy(b->ptr, src, bytes);
    st = cuda_check(d->cu->cuMemcpyHtoDAsync_v2(dst, b->ptr, bytes, s), "cuMemcpyHtoDAsync_v2");
    if (st != MAPPING_OK) {
        cuda_stage_put(b);
        return st;
    }
    return queue_done(d, s, write_done, b);
}

mapping_status cuda_staged_read(cuda_device *d, cu_stream s, cu_deviceptr src, void *dst, size_t bytes)
{
    mapping_status st;
    cuda_stage_block *b = cuda_stage_get(d, bytes, &st);
    if (!b)
        return st;
    b->copy_out = dst;
    b->copy_out_bytes = bytes;
    st = cuda_check(d->cu->cuMemcpyDtoHAsync_v2(b->ptr, src, bytes, s), "cuMemcpyDtoHAsync_v2");
    if (st != MAPPING_OK) {
        cuda_stage_put(b);
        return st;
    }
    return queue_done(d, s, read_done, b);
}
