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
/* The blocking path's stream: the legacy stream (0), never captured. */
#define LEGACY_STREAM_HANDLE ((cu_stream)0)
static const size_t STAGE_FIRST_BYTES = (size_t)16 << 20; /* made at open */
static const size_t STAGE_KEEP_BYTES = (size_t)64 << 20;  /* the high-water mark trim keeps */
static const size_t STAGE_GROW_STEP = (size_t)2 << 20;
/* Larger copies go in pieces (below). Writes: 8 MiB blocks with their
 * header, so two of them fill the 16 MiB made at open exactly. Reads: 1 MiB
 * blocks, four in flight: the caller's unpack of a piece then reads it from
 * the cache the DMA just wrote it through (on the fake driver, 8 MiB read
 * pieces reached 0.61-0.67x of a page-locked read, 1 MiB ones 0.80x;
 * writes did best with 8 MiB: 0.89-0.93x, 1 MiB: 0.62x). */
static const size_t STAGE_PIECE = ((size_t)8 << 20) - 64;
static const size_t STAGE_READ_PIECE = ((size_t)1 << 20) - 64;
/* With copy threads (os/copy_pool.c), several cores pack and unpack each
 * piece: read pieces large enough to share (below). */
static const size_t STAGE_READ_PIECE_SHARED = ((size_t)4 << 20) - 64;

static size_t align_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

_Static_assert(sizeof(cuda_stage_block) <= STAGE_ALIGN, "a block's header takes STAGE_ALIGN bytes (STAGE_PIECE)");

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
 * the arena when no chunk has room, by a chunk as large as all others
 * together, or, with `cap`, by at most max(cap, the block). */
static cuda_stage_block *stage_get_capped(cuda_device *d, size_t bytes, size_t cap, mapping_status *st)
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
    if (cap && grow > cap)
        grow = cap > size ? align_up(cap, STAGE_GROW_STEP) : align_up(size, STAGE_GROW_STEP);
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

static cuda_stage_block *stage_get(cuda_device *d, size_t bytes, mapping_status *st)
{
    return stage_get_capped(d, bytes, 0, st);
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
    mapping_os_copy_parallel(b->copy_out, block_data(b), b->copy_out_bytes);
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

/* ---- large copies: pieces through a few blocks, pack and DMA overlapping ----
 * A copy over a piece (STAGE_PIECE for writes, STAGE_READ_PIECE for reads)
 * goes in pieces through at most STAGE_WINDOW (writes) / STAGE_READ_WINDOW
 * (reads) blocks, each reused once the piece before it is through: the
 * arena grows by at most that many pieces for it (a 256 MiB copy
 * staged whole took 258 MiB of page-locked memory and one 256 MiB memcpy
 * before its DMA started). Who packs (write) or unpacks (read) a piece:
 *   - the caller, overlapping the DMA of the pieces queued before it, once
 *     the stream has reached the copy (an event recorded just before it has
 *     completed; asked again at each piece until it has): waiting for the
 *     copy's own DMAs then waits for nothing the caller does not control;
 *   - before that, a host function on the stream, in stream order, just
 *     before the piece's DMA (write) or after it (read): the call returns
 *     once queued and waits for nothing, and no more memory is taken.
 * The blocks go back in one host function after the last DMA. */
enum { STAGE_WINDOW = 2, STAGE_READ_WINDOW = 4, STAGE_WINDOW_MAX = 4 };

typedef struct piece_job {
    void       *to;
    const void *from;
    size_t      bytes;
} piece_job;

static void piece_copy(void *arg)
{
    piece_job *j = arg;
    mapping_os_copy_parallel(j->to, j->from, j->bytes);
    free(j);
}

typedef struct window_return {
    cuda_stage_block *blocks[STAGE_WINDOW_MAX];
    int               count;
} window_return;

static void window_done(void *arg)
{
    window_return *w = arg;
    for (int i = 0; i < w->count; i++)
        stage_put(w->blocks[i]);
    free(w);
}

/* A memcpy on the stream's host-function thread, in stream order. */
static mapping_status queue_piece_copy(cuda_device *d, cu_stream s, void *to, const void *from, size_t bytes)
{
    piece_job *j = mapping_os_malloc(sizeof *j);
    if (!j)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "cuda: out of memory for a staged copy");
    *j = (piece_job){to, from, bytes};
    mapping_status st = mapping__cuda_check(d->cu->cuLaunchHostFunc(s, piece_copy, j), "cuLaunchHostFunc");
    if (st != MAPPING_OK)
        free(j);
    return st;
}

/* A read's piece p (of `piece` bytes), from its block to the caller's memory. */
static void unpack(void *host, const void *slot, size_t p, size_t piece, size_t bytes)
{
    size_t at = p * piece, len = bytes - at < piece ? bytes - at : piece;
    mapping_os_copy_parallel((char *)host + at, slot, len);
}

/* A read's piece p, from its block to the caller's memory, by a host
 * function in stream order. */
static mapping_status queue_unpack(cuda_device *d, cu_stream s, void *host, const void *slot, size_t p, size_t piece,
                                   size_t bytes)
{
    size_t at = p * piece, len = bytes - at < piece ? bytes - at : piece;
    return queue_piece_copy(d, s, (char *)host + at, slot, len);
}

/* A read's piece: 1 MiB when one thread unpacks (the unpack then reads it
 * from the cache the DMA wrote it through), 4 MiB when the copy threads
 * share it (os/copy_pool.c: parts of at least 512 KiB each). */
static size_t read_piece(void)
{
    return mapping_os_copy_threads() > 0 ? STAGE_READ_PIECE_SHARED : STAGE_READ_PIECE;
}

/* host: the caller's pageable memory; dev: the device address; to_device:
 * a write. */
static mapping_status staged_pieces(cuda_device *d, cu_stream s, void *host, cu_deviceptr dev, size_t bytes,
                                    bool to_device)
{
    const cuda_driver *cu = d->cu;
    const size_t piece = to_device ? STAGE_PIECE : read_piece();
    const int window = to_device ? STAGE_WINDOW : STAGE_READ_WINDOW;
    size_t n = (bytes + piece - 1) / piece;
    int k = n < (size_t)window ? (int)n : window;
    window_return *w = mapping_os_calloc(1, sizeof *w);
    if (!w)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "cuda: out of memory for a staged copy");
    cu_event done[STAGE_WINDOW_MAX] = {0}, start = NULL;
    mapping_status st = MAPPING_OK;
    const size_t cap = (size_t)window * (header_bytes() + piece);
    for (int j = 0; j < k && st == MAPPING_OK; j++)
        if ((w->blocks[j] = stage_get_capped(d, piece, cap, &st)) != NULL)
            w->count++;
    for (int j = 0; j < k && st == MAPPING_OK; j++)
        st = mapping__cuda_event_take(d, &d->untimed_events, &done[j]);
    if (st == MAPPING_OK)
        st = mapping__cuda_event_take(d, &d->untimed_events, &start);
    if (st == MAPPING_OK)
        st = mapping__cuda_check(cu->cuEventRecord(start, s), "cuEventRecord");
    if (st != MAPPING_OK) {
        window_done(w); /* nothing queued uses them */
        goto out;
    }
    /* reached: the stream has reached the copy (and stays past it), so the
     * caller may wait for the copy's own DMAs; asked again for every piece
     * until it is true. Before that, host functions pack / unpack. */
    bool reached = false;
    for (size_t i = 0; i < n && st == MAPPING_OK; i++) {
        int j = (int)(i % (size_t)k);
        void *slot = block_data(w->blocks[j]);
        if (i >= (size_t)k) { /* block j is reused: its last piece must be through */
            if (!reached)
                reached = cu->cuEventQuery(start) == CU_SUCCESS;
            if (reached && (st = mapping__cuda_check(cu->cuEventSynchronize(done[j]), "cuEventSynchronize")) ==
                               MAPPING_OK && !to_device)
                unpack(host, slot, i - (size_t)k, piece, bytes);
            else if (!reached && !to_device) /* in stream order: after its DMA, before the next one */
                st = queue_unpack(d, s, host, slot, i - (size_t)k, piece, bytes);
            if (st != MAPPING_OK)
                break;
        }
        size_t at = i * piece, len = bytes - at < piece ? bytes - at : piece;
        if (to_device) {
            if (reached || i < (size_t)k) /* a block not in use yet, or one the caller waited for */
                mapping_os_copy_parallel(slot, (const char *)host + at, len);
            else
                st = queue_piece_copy(d, s, slot, (const char *)host + at, len);
            if (st == MAPPING_OK)
                st = mapping__cuda_check(cu->cuMemcpyHtoDAsync_v2(dev + at, slot, len, s), "cuMemcpyHtoDAsync_v2");
        } else {
            st = mapping__cuda_check(cu->cuMemcpyDtoHAsync_v2(slot, dev + at, len, s), "cuMemcpyDtoHAsync_v2");
        }
        if (st == MAPPING_OK)
            st = mapping__cuda_check(cu->cuEventRecord(done[j], s), "cuEventRecord");
    }
    /* The last pieces of a read. */
    for (size_t i = n > (size_t)k ? n - (size_t)k : 0; i < n && st == MAPPING_OK && !to_device; i++) {
        int j = (int)(i % (size_t)k);
        if (!reached)
            reached = cu->cuEventQuery(start) == CU_SUCCESS;
        if (!reached)
            st = queue_unpack(d, s, host, block_data(w->blocks[j]), i, piece, bytes);
        else if ((st = mapping__cuda_check(cu->cuEventSynchronize(done[j]), "cuEventSynchronize")) == MAPPING_OK)
            unpack(host, block_data(w->blocks[j]), i, piece, bytes);
    }
    /* The blocks go back when the stream has passed the last DMA (after a
     * failure too: what was queued may still run). */
    if (cu->cuLaunchHostFunc(s, window_done, w) != CU_SUCCESS) {
        mapping_status synced = mapping__cuda_check(cu->cuStreamSynchronize(s), "cuStreamSynchronize");
        window_done(w);
        if (st == MAPPING_OK)
            st = synced != MAPPING_OK ? synced : mapping__fail(MAPPING_ERR_DRIVER, "cuda: cuLaunchHostFunc failed");
    }
out:
    for (int j = 0; j < k; j++)
        if (done[j])
            mapping__cuda_event_give(d, &d->untimed_events, done[j]);
    if (start)
        mapping__cuda_event_give(d, &d->untimed_events, start);
    return st;
}

/* A staged copy packs (or unpacks) host memory when it is queued, or in
 * host functions that free its blocks: in a capture, replays would move the
 * bytes of capture time, and reuse blocks given back. The core refuses such
 * copies at the public call; this refuses them for the library's own. */
static mapping_status refuse_in_capture(cuda_device *d, cu_stream s)
{
    if (s == LEGACY_STREAM_HANDLE || !mapping__cuda_capturing(d, s))
        return MAPPING_OK;
    return mapping__cuda_capture_refusal("a copy of pageable host memory on a capturing stream (it is staged now: "
                                         "every replay would move the bytes of capture time); use page-locked "
                                         "memory (mapping_allocate_cpu, a pinned mirror, torch pin_memory)");
}

mapping_status mapping__cuda_staged_write(cuda_device *d, cu_stream s, const void *src, cu_deviceptr dst, size_t bytes)
{
    mapping_status refused = refuse_in_capture(d, s);
    if (refused != MAPPING_OK)
        return refused;
    if (bytes > STAGE_PIECE)
        return staged_pieces(d, s, (void *)(uintptr_t)src, dst, bytes, true);
    mapping_status st;
    cuda_stage_block *b = stage_get(d, bytes, &st);
    if (!b)
        return st;
    mapping_os_copy_parallel(block_data(b), src, bytes);
    st = mapping__cuda_check(d->cu->cuMemcpyHtoDAsync_v2(dst, block_data(b), bytes, s), "cuMemcpyHtoDAsync_v2");
    if (st != MAPPING_OK) {
        stage_put(b);
        return st;
    }
    return queue_done(d, s, write_done, b);
}

mapping_status mapping__cuda_staged_read(cuda_device *d, cu_stream s, cu_deviceptr src, void *dst, size_t bytes)
{
    mapping_status refused = refuse_in_capture(d, s);
    if (refused != MAPPING_OK)
        return refused;
    if (bytes > read_piece())
        return staged_pieces(d, s, dst, src, bytes, false);
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
