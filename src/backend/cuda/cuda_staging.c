/*
 * Asynchronous copies of pageable host memory. cuMemcpy*Async on pageable
 * memory "might be synchronous with respect to the host": to read into
 * pageable memory the driver waits until the stream reaches the copy, so a
 * stream held by earlier work (a host function waiting for the caller, say)
 * would hang the caller. The library promises that a call on a stream returns
 * once the work is queued, so the back end stages such copies itself through
 * blocks of a per-device page-locked arena:
 *   write: memcpy into a block now, cuMemcpyHtoDAsync from it, and a host
 *          function gives the block back when the stream gets there;
 *   read:  cuMemcpyDtoHAsync into a block, then a host function copies it to
 *          the caller's memory and gives the block back.
 *
 * Page-locked allocations and frees are slow (tens to hundreds of us) and a
 * real driver may synchronize them with every stream, which hangs a caller
 * whose stream waits for it. So the arena is one chunk of cuMemHostAlloc
 * memory made at open and used as a ring: a block is carved at the ring's
 * head, and the tail moves past blocks as they come back (blocks of several
 * streams may come back out of order; the tail waits for the oldest). Blocks
 * are never waited for: when no chunk has room, the arena grows by a chunk at
 * least as large as all the others together, so growing is rare. Idle chunks
 * beyond the high-water mark are freed only where the back end frees driver
 * memory anyway (buffer and host-memory frees, stream destruction), never in
 * a synchronize, a copy or a host function (which may not call the driver).
 */
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_device.h"
#include "os/os.h"
#include "os/status.h"

enum { STAGE_ALIGN = 64 };
static const size_t STAGE_FIRST_BYTES = (size_t)16 << 20; /* made at open */
static const size_t STAGE_KEEP_BYTES = (size_t)64 << 20;  /* the high-water mark trim keeps */
static const size_t STAGE_GROW_STEP = (size_t)2 << 20;

static size_t align_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

static size_t header_bytes(void)
{
    return align_up(sizeof(cuda_stage_block), STAGE_ALIGN);
}

static cuda_stage_chunk *chunk_new(cuda_device *d, size_t size, mapping_status *st)
{
    cuda_stage_chunk *c = mapping_os_calloc(1, sizeof *c);
    if (!c) {
        *st = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "cuda: out of memory");
        return NULL;
    }
    void *p = NULL;
    *st = mapping__cuda_check(d->cu->cuMemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE_), "cuMemHostAlloc");
    if (*st != MAPPING_OK) {
        if (*st == MAPPING_ERR_OUT_OF_DEVICE_MEMORY)
            *st = MAPPING_ERR_OUT_OF_HOST_MEMORY;
        free(c);
        return NULL;
    }
    c->base = p;
    c->size = size;
    return c;
}

static void chunk_free(cuda_device *d, cuda_stage_chunk *c)
{
    d->cu->cuMemFreeHost(c->base);
    free(c);
}

mapping_status mapping__cuda_staging_init(cuda_device *d)
{
    cuda_staging *arena = &d->staging;
    memset(arena, 0, sizeof *arena);
    pthread_mutex_init(&arena->lock, NULL);
    mapping_status st;
    arena->chunks = chunk_new(d, STAGE_FIRST_BYTES, &st);
    if (!arena->chunks) {
        pthread_mutex_destroy(&arena->lock);
        return st;
    }
    arena->total = STAGE_FIRST_BYTES;
    return MAPPING_OK;
}

/* A block of `size` bytes (header included) from the chunk's ring, or NULL.
 * The arena's lock is held. */
static cuda_stage_block *ring_take(cuda_stage_chunk *c, size_t size)
{
    if (c->blocks == 0)
        c->head = c->tail = 0, c->wrapped = false;
    size_t at;
    if (!c->wrapped) {
        if (c->head + size <= c->size) {
            at = c->head;
        } else if (size <= c->tail) { /* wrap: the blocks before the wrap end at head */
            c->wrap_end = c->head;
            c->wrapped = true;
            at = 0;
        } else {
            return NULL;
        }
    } else if (c->head + size <= c->tail) {
        at = c->head;
    } else {
        return NULL;
    }
    c->head = at + size;
    c->blocks++;
    cuda_stage_block *b = (cuda_stage_block *)(void *)(c->base + at);
    memset(b, 0, sizeof *b);
    b->chunk = c;
    b->size = size;
    return b;
}

/* Moves the tail past blocks that came back. The arena's lock is held. */
static void ring_reclaim(cuda_stage_chunk *c)
{
    while (c->blocks > 0) {
        cuda_stage_block *b = (cuda_stage_block *)(void *)(c->base + c->tail);
        if (!b->returned)
            break;
        c->tail += b->size;
        c->blocks--;
        if (c->wrapped && c->tail == c->wrap_end)
            c->tail = 0, c->wrapped = false;
    }
    if (c->blocks == 0)
        c->head = c->tail = 0, c->wrapped = false;
}

/* A block for `bytes` of data; the context is current. Never waits: grows
 * the arena when no chunk has room. */
static cuda_stage_block *stage_get(cuda_device *d, size_t bytes, mapping_status *st)
{
    cuda_staging *arena = &d->staging;
    size_t size = header_bytes() + align_up(bytes ? bytes : 1, STAGE_ALIGN);
    pthread_mutex_lock(&arena->lock);
    cuda_stage_block *b = NULL;
    for (cuda_stage_chunk *c = arena->chunks; c && !b; c = c->next)
        b = ring_take(c, size);
    size_t grow = align_up(size, STAGE_GROW_STEP);
    if (grow < arena->total)
        grow = arena->total;
    pthread_mutex_unlock(&arena->lock);
    if (b) {
        b->arena = arena;
        return b;
    }
    cuda_stage_chunk *c = chunk_new(d, grow, st);
    if (!c)
        return NULL;
    mapping__log(2, "cuda: the staging arena grows by %zu bytes (a queued copy of %zu bytes found no room)", grow,
                 bytes);
    pthread_mutex_lock(&arena->lock);
    b = ring_take(c, size);
    cuda_stage_chunk **last = &arena->chunks;
    while (*last)
        last = &(*last)->next;
    *last = c;
    arena->total += c->size;
    pthread_mutex_unlock(&arena->lock);
    b->arena = arena;
    return b;
}

/* Gives a block back; no driver call, so host functions may use it. */
static void stage_put(cuda_stage_block *b)
{
    cuda_staging *arena = b->arena;
    pthread_mutex_lock(&arena->lock);
    b->returned = true;
    ring_reclaim(b->chunk);
    pthread_mutex_unlock(&arena->lock);
}

static void *block_data(cuda_stage_block *b)
{
    return (char *)b + header_bytes();
}

void mapping__cuda_staging_trim(cuda_device *d)
{
    cuda_staging *arena = &d->staging;
    cuda_stage_chunk *doomed = NULL;
    pthread_mutex_lock(&arena->lock);
    if (arena->chunks) /* the first chunk stays */
        for (cuda_stage_chunk **p = &arena->chunks->next; *p && arena->total > STAGE_KEEP_BYTES;) {
            cuda_stage_chunk *c = *p;
            if (c->blocks != 0) {
                p = &c->next;
                continue;
            }
            *p = c->next;
            arena->total -= c->size;
            c->next = doomed;
            doomed = c;
        }
    pthread_mutex_unlock(&arena->lock);
    while (doomed) {
        cuda_stage_chunk *next = doomed->next;
        chunk_free(d, doomed);
        doomed = next;
    }
}

void mapping__cuda_staging_destroy(cuda_device *d)
{
    cuda_staging *arena = &d->staging;
    while (arena->chunks) {
        cuda_stage_chunk *next = arena->chunks->next;
        chunk_free(d, arena->chunks);
        arena->chunks = next;
    }
    arena->total = 0;
    pthread_mutex_destroy(&arena->lock);
}

/* ---- the two staged copies ---- */

static void write_done(void *arg)
{
    stage_put(arg);
}

static void read_done(void *arg)
{
    cuda_stage_block *b = arg;
    memcpy(b->copy_out, block_data(b), b->copy_out_bytes);
    stage_put(b);
}

/* After the copy is queued: queue `done`, or, if the driver refuses, wait
 * for the copy and finish here so the block is never lost in flight. When
 * the wait fails (the copy may not have run: a sticky error, say), the block
 * only goes back: a read must not hand its stale bytes to the caller. */
static mapping_status queue_done(cuda_device *d, cu_stream s, cu_host_fn done, cuda_stage_block *b)
{
    if (d->cu->cuLaunchHostFunc(s, done, b) == CU_SUCCESS)
        return MAPPING_OK;
    mapping_status st = mapping__cuda_check(d->cu->cuStreamSynchronize(s), "cuStreamSynchronize");
    if (st == MAPPING_OK)
        done(b);
    else
        stage_put(b);
    return st;
}

mapping_status mapping__cuda_staged_write(cuda_device *d, cu_stream s, const void *src, cu_deviceptr dst, size_t bytes)
{
    mapping_status st;
    cuda_stage_block *b = stage_get(d, bytes, &st);
    if (!b)
        return st;
    memcpy(block_data(b), src, bytes);
    st = mapping__cuda_check(d->cu->cuMemcpyHtoDAsync_v2(dst, block_data(b), bytes, s), "cuMemcpyHtoDAsync_v2");
    if (st != MAPPING_OK) {
        stage_put(b);
        return st;
    }
    return queue_done(d, s, write_done, b);
}

mapping_status mapping__cuda_staged_read(cuda_device *d, cu_stream s, cu_deviceptr src, void *dst, size_t bytes)
{
    mapping_status st;
    cuda_stage_block *b = stage_get(d, bytes, &st);
    if (!b)
        return st;
    b->copy_out = dst;
    b->copy_out_bytes = bytes;
    st = mapping__cuda_check(d->cu->cuMemcpyDtoHAsync_v2(block_data(b), src, bytes, s), "cuMemcpyDtoHAsync_v2");
    if (st != MAPPING_OK) {
        stage_put(b);
        return st;
    }
    return queue_done(d, s, read_done, b);
}
