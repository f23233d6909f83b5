/*
 * In-place registration of large pageable host memory, cached
 * (mapping_device_set_host_registration, opt-in). A copy of pageable memory
 * goes through page-locked staging: two CPU copies, which no number of
 * cores brings to link speed (0.43-0.55x of page-locked on an H200). With
 * registration on, a copy of at least `min_bytes` page-locks its host range
 * in place (the back end's host_register: cuMemHostRegister) and keeps it,
 * so this copy and the later ones of the same memory are DMAs from it.
 *
 * - Chunked: a range is registered in chunks of at most REGISTER_CHUNK
 *   (64 MiB), whose boundaries fall on 2 MiB, so that no huge page is split
 *   between two registrations; a chunk the driver refuses as too large
 *   (a per-call limit) is retried in halves, down to 2 MiB, and the device
 *   remembers the smaller size.
 * - In parallel: the chunks of one copy are registered by several threads
 *   (pinning touches every page; for 4 KiB pages the kernel's work per page
 *   is most of it), at most REGISTER_THREADS.
 * - Cached: registrations stay until the cache holds more than
 *   `cache_bytes`; then the least recently used ones (not the current
 *   copy's) are unregistered. A copy spanning several chunks moves chunk
 *   by chunk (ops.c).
 * - What cannot be registered (memory already page-locked by someone else,
 *   read-only memory) is remembered as such and staged as before.
 *
 * The contract (mapping.h): memory the cache holds stays mapped until
 * mapping_host_registration_forget covers it, registration is turned off, or
 * the device closes: an address range unmapped and mapped again while
 * registered would be moved from the old pages.
 */
#include <stdlib.h>
#include <string.h>
#include "core/ops.h"
#include "os/os.h"

enum { REGISTER_THREADS = 8, REGISTER_ALIGN = 2 << 20 };
static const size_t REGISTER_CHUNK = (size_t)64 << 20;

typedef struct cache_entry {
    uintptr_t start;
    size_t    bytes;
    void     *cookie;
    uint64_t  used;
    bool      failed; /* the driver would not register it: stage */
} cache_entry;

struct mapping_host_cache {
    pthread_mutex_t lock;
    size_t          cap_bytes, total;
    size_t          chunk; /* the largest registration the driver took, halved on refusals */
    cache_entry    *e;     /* sorted by start, disjoint */
    size_t          count, capacity;
    uint64_t        clock;
};

static size_t page_down(uintptr_t a)
{
    size_t page = mapping_os_page_size();
    return a / page * page;
}

static size_t page_up(uintptr_t a)
{
    size_t page = mapping_os_page_size();
    return (a + page - 1) / page * page;
}

/* ---- the sorted list ---- */

static size_t first_ending_after(const mapping_host_cache *c, uintptr_t a)
{
    size_t lo = 0, hi = c->count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c->e[mid].start + c->e[mid].bytes <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static mapping_status insert(mapping_host_cache *c, cache_entry entry)
{
    if (c->count == c->capacity) {
        size_t cap = c->capacity ? 2 * c->capacity : 16;
        cache_entry *e = mapping_os_realloc(c->e, cap * sizeof *e);
        if (!e)
            return MAPPING_ERR_OUT_OF_HOST_MEMORY;
        c->e = e;
        c->capacity = cap;
    }
    size_t i = first_ending_after(c, entry.start);
    memmove(c->e + i + 1, c->e + i, (c->count - i) * sizeof *c->e);
    c->e[i] = entry;
    c->count++;
    if (!entry.failed)
        c->total += entry.bytes;
    return MAPPING_OK;
}

static void drop(mapping_device *dev, mapping_host_cache *c, size_t i)
{
    cache_entry e = c->e[i];
    memmove(c->e + i, c->e + i + 1, (c->count - i - 1) * sizeof *c->e);
    c->count--;
    if (!e.failed) {
        c->total -= e.bytes;
        mapping__op_host_unregister(dev, (void *)e.start, e.cookie);
    }
}

/* ---- registering a range's gaps, chunk by chunk, on several threads ---- */

typedef struct chunk_job {
    mapping_device *dev;
    uintptr_t       start;
    size_t          bytes;
    void           *cookie;
    mapping_status  st;
} chunk_job;

static void *register_chunk(void *arg)
{
    chunk_job *j = arg;
    mapping_error_mark before;
    mapping__error_mark(&before);
    j->st = mapping__op_host_register(j->dev, (void *)j->start, j->bytes, &j->cookie);
    mapping__error_forget(&before); /* a refusal is not the caller's error: the copy is staged */
    return NULL;
}

/* Runs the jobs, REGISTER_THREADS at a time (the caller registers one). */
static void run_jobs(chunk_job *jobs, size_t n)
{
    for (size_t first = 0; first < n; first += REGISTER_THREADS) {
        size_t k = n - first < REGISTER_THREADS ? n - first : REGISTER_THREADS;
        pthread_t threads[REGISTER_THREADS];
        bool started[REGISTER_THREADS] = {false};
        for (size_t i = 1; i < k; i++)
            started[i] = mapping_os_thread_create(&threads[i], NULL, register_chunk, &jobs[first + i]) == 0;
        register_chunk(&jobs[first]);
        for (size_t i = 1; i < k; i++) {
            if (started[i])
                pthread_join(threads[i], NULL);
            else
                register_chunk(&jobs[first + i]);
        }
    }
}

/* Cuts [start, end) into jobs of at most `chunk` bytes, cut on 2 MiB. */
static size_t cut(mapping_device *dev, uintptr_t start, uintptr_t end, size_t chunk, chunk_job *jobs, size_t max)
{
    size_t n = 0;
    for (uintptr_t at = start; at < end && n < max;) {
        uintptr_t next = (at / chunk + 1) * chunk; /* chunk is a multiple of REGISTER_ALIGN */
        if (next > end)
            next = end;
        jobs[n++] = (chunk_job){dev, at, next - at, NULL, MAPPING_OK};
        at = next;
    }
    return n;
}

/* Keeps job j's outcome: registered, or failed (staged from then on). */
static mapping_status keep(mapping_device *dev, mapping_host_cache *c, const chunk_job *j)
{
    bool ok = j->st == MAPPING_OK;
    mapping_status st = insert(c, (cache_entry){j->start, j->bytes, j->cookie, ++c->clock, !ok});
    if (st != MAPPING_OK && ok)
        mapping__op_host_unregister(dev, (void *)j->start, j->cookie);
    return st;
}

/* Registers the gap [start, end) in chunks of `chunk` bytes; what the
 * driver refuses is tried again in halves (a per-call limit?), down to
 * REGISTER_ALIGN, and kept as failed at the end. *took: some chunk was
 * registered. A smaller chunk that worked becomes the device's. */
static mapping_status register_gap(mapping_device *dev, mapping_host_cache *c, uintptr_t start, uintptr_t end,
                                   size_t chunk, bool *took)
{
    size_t chunks = (end - start) / REGISTER_ALIGN + 2;
    chunk_job *jobs = mapping_os_calloc(chunks, sizeof *jobs);
    if (!jobs)
        return MAPPING_ERR_OUT_OF_HOST_MEMORY;
    size_t n = cut(dev, start, end, chunk, jobs, chunks);
    run_jobs(jobs, n);
    mapping_status st = MAPPING_OK;
    for (size_t i = 0; i < n && st == MAPPING_OK; i++) {
        bool retry = jobs[i].st != MAPPING_OK && jobs[i].st != MAPPING_ERR_UNSUPPORTED && chunk > REGISTER_ALIGN &&
                     jobs[i].bytes > REGISTER_ALIGN;
        bool half_took = false;
        if (retry && (st = register_gap(dev, c, jobs[i].start, jobs[i].start + jobs[i].bytes, chunk / 2,
                                        &half_took)) == MAPPING_OK && half_took && chunk / 2 < c->chunk)
            c->chunk = chunk / 2;
        else if (!retry)
            st = keep(dev, c, &jobs[i]);
        *took = *took || half_took || jobs[i].st == MAPPING_OK;
    }
    free(jobs);
    return st;
}

/* Unregisters least recently used entries outside [keep_lo, keep_hi) while
 * the cache holds more than its capacity. */
static void evict(mapping_device *dev, mapping_host_cache *c, uintptr_t keep_lo, uintptr_t keep_hi)
{
    while (c->total > c->cap_bytes) {
        size_t victim = c->count;
        for (size_t i = 0; i < c->count; i++) {
            const cache_entry *e = &c->e[i];
            bool kept = e->start < keep_hi && keep_lo < e->start + e->bytes;
            if (!e->failed && !kept && (victim == c->count || e->used < c->e[victim].used))
                victim = i;
        }
        if (victim == c->count)
            return; /* only the current copy's: over capacity until the next copy */
        drop(dev, c, victim);
    }
}

/* Registers what [lo, hi) lacks; whether all of it is registered now. */
static bool cover(mapping_device *dev, mapping_host_cache *c, uintptr_t lo, uintptr_t hi)
{
    for (uintptr_t at = lo; at < hi;) {
        size_t i = first_ending_after(c, at);
        if (i < c->count && c->e[i].start <= at) { /* at lies in entry i */
            if (c->e[i].failed)
                return false;
            c->e[i].used = ++c->clock;
            at = c->e[i].start + c->e[i].bytes;
            continue;
        }
        uintptr_t gap_end = i < c->count && c->e[i].start < hi ? c->e[i].start : hi;
        bool took = false;
        if (register_gap(dev, c, at, gap_end, c->chunk, &took) != MAPPING_OK)
            return false; /* out of memory for the list: stage */
    }
    return true;
}

bool mapping__host_cache_prepare(mapping_device *dev, const void *ptr, size_t bytes)
{
    mapping_host_cache *c = dev->host_cache;
    if (!c)
        return false;
    uintptr_t lo = page_down((uintptr_t)ptr), hi = page_up((uintptr_t)ptr + bytes);
    pthread_mutex_lock(&c->lock);
    bool ok = c->cap_bytes > 0 && cover(dev, c, lo, hi);
    if (ok)
        evict(dev, c, lo, hi);
    pthread_mutex_unlock(&c->lock);
    return ok;
}

bool mapping__host_cache_piece(mapping_device *dev, const void *ptr, size_t bytes, mapping_host_ref *ref, size_t *len)
{
    mapping_host_cache *c = dev->host_cache;
    uintptr_t a = (uintptr_t)ptr;
    pthread_mutex_lock(&c->lock);
    size_t i = first_ending_after(c, a);
    bool found = i < c->count && c->e[i].start <= a && !c->e[i].failed;
    if (found) {
        size_t room = c->e[i].start + c->e[i].bytes - a;
        *len = bytes < room ? bytes : room;
        *ref = (mapping_host_ref){c->e[i].cookie, a - c->e[i].start};
    }
    pthread_mutex_unlock(&c->lock);
    return found;
}

bool mapping__host_cache_holds(mapping_device *dev, const void *ptr, size_t bytes)
{
    mapping_host_cache *c = dev->host_cache;
    if (!c || bytes == 0)
        return false;
    uintptr_t a = (uintptr_t)ptr;
    pthread_mutex_lock(&c->lock);
    bool held = false;
    for (size_t i = first_ending_after(c, a); i < c->count && c->e[i].start < a + bytes && !held; i++)
        held = !c->e[i].failed;
    pthread_mutex_unlock(&c->lock);
    return held;
}

/* Drops every entry overlapping [lo, hi). */
static void forget(mapping_device *dev, mapping_host_cache *c, uintptr_t lo, uintptr_t hi)
{
    for (size_t i = first_ending_after(c, lo); i < c->count && c->e[i].start < hi;)
        drop(dev, c, i);
}

void mapping__host_cache_destroy(mapping_device *dev)
{
    mapping_host_cache *c = dev->host_cache;
    if (!c)
        return;
    atomic_store(&dev->host_cache_min, 0);
    forget(dev, c, 0, UINTPTR_MAX);
    free(c->e);
    pthread_mutex_destroy(&c->lock);
    free(c);
    dev->host_cache = NULL;
}

/* ---- public ---- */

mapping_status mapping_device_set_host_registration(mapping_device *dev, size_t min_bytes, size_t cache_bytes)
{
    static const char fn[] = "mapping_device_set_host_registration";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)))
        return st;
    size_t page = mapping_os_page_size();
    if (min_bytes && (min_bytes < page || cache_bytes < min_bytes))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: min_bytes %zu, cache_bytes %zu: min_bytes must be at least a page (%zu) and "
                             "cache_bytes at least min_bytes (or both 0: off)",
                             fn, min_bytes, cache_bytes, page);
    if (!min_bytes && cache_bytes)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: cache_bytes %zu with min_bytes 0: both 0 turns it off",
                             fn, cache_bytes);
    if (min_bytes && !mapping__can_register_host(dev))
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: back end %s cannot page-lock memory in place", fn,
                             dev->be->name);
    pthread_mutex_lock(&dev->objects_lock);
    mapping_host_cache *c = dev->host_cache;
    if (!c && min_bytes && (c = mapping_os_calloc(1, sizeof *c)) != NULL) {
        pthread_mutex_init(&c->lock, NULL);
        c->chunk = REGISTER_CHUNK;
        dev->host_cache = c;
    }
    pthread_mutex_unlock(&dev->objects_lock);
    if (min_bytes && !c)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    if (!c)
        return MAPPING_OK;
    pthread_mutex_lock(&c->lock);
    c->cap_bytes = cache_bytes;
    if (!min_bytes)
        forget(dev, c, 0, UINTPTR_MAX);
    else
        evict(dev, c, 0, 0);
    atomic_store(&dev->host_cache_min, min_bytes);
    pthread_mutex_unlock(&c->lock);
    return MAPPING_OK;
}

mapping_status mapping_host_registration_forget(mapping_device *dev, const void *ptr, size_t bytes)
{
    static const char fn[] = "mapping_host_registration_forget";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "ptr", ptr)))
        return st;
    if ((uintptr_t)ptr + bytes < (uintptr_t)ptr)
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "%s: ptr %p + %zu bytes wraps around", fn, ptr, bytes);
    mapping_host_cache *c = dev->host_cache;
    if (!c || bytes == 0)
        return MAPPING_OK;
    pthread_mutex_lock(&c->lock);
    forget(dev, c, page_down((uintptr_t)ptr), page_up((uintptr_t)ptr + bytes));
    pthread_mutex_unlock(&c->lock);
    return MAPPING_OK;
}
