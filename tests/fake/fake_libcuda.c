/*
 * A fake libcuda for tests: the part of the CUDA driver API the cuda back end
 * uses, run on the CPU, so the back end's own logic runs on machines without
 * a GPU (ctest labels fakecuda and fakecuda128: the conformance, internal and
 * cuda-only tests with MAPPING_CUDA_LIBRARY pointing here). It is strict: it
 * refuses what a real driver refuses and blocks where a real one blocks, so a
 * back end that would hang or fail on a GPU hangs or fails here first.
 *
 * - Calls that need a context fail with CUDA_ERROR_INVALID_CONTEXT when none
 *   is current on the calling thread (contexts are per thread); driver calls
 *   from a host function fail (CUDA_ERROR_NOT_PERMITTED).
 * - Allocations and frees of device and page-locked memory (cuMemAlloc,
 *   cuMemAllocManaged, cuMemFree, cuMemHostAlloc, cuMemFreeHost,
 *   cuMemHostRegister, cuMemHostUnregister) first wait for every stream: a
 *   real driver does so for frees, and may for allocations ("implicit
 *   synchronization"); FAKE_LIBCUDA_SYNC_ALLOC=0 spares allocations. One
 *   that waits longer than FAKE_LIBCUDA_DEADLOCK_SECONDS (default 8, under
 *   the 10 s of the tests' gates) for a stream whose host function never
 *   returns aborts, naming the call: on a GPU it would hang.
 * - Host functions of all streams run one at a time on one driver thread.
 * - The legacy stream (0) runs asynchronously on its own thread; the blocking
 *   calls behave as documented ("API synchronization behavior"): cuMemcpyHtoD
 *   from pageable memory and cuMemcpyDtoD / cuMemsetD8 return before the
 *   copy is done; an Async copy to or from pageable memory waits for its
 *   stream first.
 * - cuMemHostRegister of memory that overlaps page-locked memory already
 *   known returns CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (712).
 * - A device address outside every allocation is an illegal address (700):
 *   the error becomes sticky (every later call returns it, later work and
 *   host functions are skipped) until the primary context resets.
 * - cuEventElapsedTime on an event never recorded: CUDA_ERROR_INVALID_HANDLE.
 * - The primary context resets when its reference count reaches 0: every
 *   stream, event and allocation of it is gone (what the back end left is
 *   counted as "leaked_at_reset" and reported on stderr).
 * - Every second cuMemHostAlloc block is 64 bytes past a page boundary (all
 *   of them with FAKE_LIBCUDA_MISALIGN_HOST=1), as the driver does not
 *   promise page alignment.
 * - cuGetErrorName is not exported (the back end names errors itself).
 * - Modules load lazily, as with CUDA_MODULE_LOADING=LAZY (the default since
 *   CUDA 12.2): cuModuleLoadData, and the first launch of a function that
 *   cuFuncLoad did not load, wait for every stream (the driver may
 *   synchronize the context to load), aborting as allocations do when a
 *   stream never finishes. "lazy_loads" counts first launches that loaded.
 * FAKE_LIBCUDA_STRICT=0 turns off the waiting of allocations and frees, the
 * single host-function thread and the misaligned blocks.
 *
 * Driver profiles (compile-time, since a driver's exports are what the back
 * end looks up): FAKE_CUDA_VERSION=13000 (the default) exports the CUDA 13
 * names (cuMemcpyBatchAsync_v2, cuMemPrefetchAsync_v2, cuEventElapsedTime_v2)
 * beside the older ones a CUDA 13 driver keeps; 12080 exports only the
 * CUDA 12.8 ones (the 9-argument cuMemcpyBatchAsync with failIdx, the CUDA 8
 * cuMemPrefetchAsync, cuEventElapsedTime).
 *
 * - The special stream handles CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD
 *   (0x2) are accepted wherever a CUstream is, as the legacy stream itself
 *   (the per-thread stream synchronizes with it on a real driver; here it is
 *   simply that stream, which keeps every order a real driver keeps); they
 *   cannot be destroyed, and cuMemcpyBatchAsync refuses CU_STREAM_LEGACY as
 *   it refuses 0. Any other handle that is not a live stream is
 *   CUDA_ERROR_INVALID_HANDLE.
 *
 * Gauges (fake_cuda_count reads them too; fake_cuda_reset_gauges zeroes
 * them): "largest_host_alloc" (bytes of the largest cuMemHostAlloc),
 * "largest_pinned_async_copy" (the largest cuMemcpy*Async of page-locked
 * memory), "copy_entries_largest_piece" and "copy_entries_threads_per_entry"
 * (the scatter kernel's shape).
 * For tests: fake_cuda_count("cuMemHostAlloc") returns how often a call ran
 * ("forbidden": allocations refused, "leaked_at_reset";
 * "cuStreamSynchronize_legacy": those of them on the CU_STREAM_LEGACY handle;
 * "cuMemcpyHtoD" and the like: the _v2 copies by their plain name), and
 * fake_cuda_forbid_alloc(1) makes every allocation and free fail with
 * CUDA_ERROR_NOT_PERMITTED (and count as "forbidden") until
 * fake_cuda_forbid_alloc(0). fake_cuda_hold_legacy(1) stops the legacy
 * stream from starting its next op until fake_cuda_hold_legacy(0) (work a
 * user queued on the device's native queue, not yet done).
 * FAKE_LIBCUDA_COUNTS=1 prints every count at
 * exit. Streams are worker threads; device memory is malloc. It proves
 * nothing about real GPUs: tests/gpu/run.sh does that.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))

#ifndef FAKE_CUDA_VERSION
#define FAKE_CUDA_VERSION 13000
#endif

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void (*host_fn)(void *);
enum {
    OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201, INVALID_HANDLE = 400, NOT_FOUND = 500, NOT_READY = 600, ILLEGAL_ADDRESS = 700,
    HOST_MEMORY_ALREADY_REGISTERED = 712, HOST_MEMORY_NOT_REGISTERED = 713, NOT_PERMITTED = 800,
};

static bool initialized;
static bool strict = true;
static bool sync_alloc; /* allocations wait for every stream too (strict) */
static double deadlock_seconds = 8;
static _Thread_local bool in_host_fn;
static int sticky; /* the context's sticky error, 0 when none */
static bool function_loaded, saxpy_loaded, jacobi_loaded, diff_loaded; /* kernels loaded by cuFuncLoad or a first launch */
static bool copy_entries_split; /* the loaded mapping_copy_entries takes `split` (a 6th parameter) */

/* ---- counters ---- */
#define FAKE_COUNTERS(X)                                                                                     \
    X(cuMemAlloc) X(cuMemAllocManaged) X(cuMemFree) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostRegister)  \
    X(cuMemHostUnregister) X(cuMemcpyBatchAsync) X(cuMemcpyBatchAsync_v2) X(cuMemPrefetchAsync)              \
    X(cuMemPrefetchAsync_v2) X(cuEventElapsedTime) X(cuEventElapsedTime_v2) X(cuLaunchHostFunc)              \
    X(cuStreamSynchronize) X(cuStreamCreate) X(forbidden) X(leaked_at_reset) X(context_resets)               \
    X(cuStreamSynchronize_legacy) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)   \
    X(cuLaunchKernel) X(cuEventSynchronize) X(cuModuleLoadData) X(cuFuncLoad) X(lazy_loads)               \
    X(copy_entries_largest_piece) X(copy_entries_threads_per_entry) X(largest_host_alloc)                   \
    X(largest_pinned_async_copy)
enum {
#define ENUM_(name) COUNT_##name,
    FAKE_COUNTERS(ENUM_)
#undef ENUM_
    COUNTERS
};
static const char *const counter_names[] = {
#define NAME_(name) #name,
    FAKE_COUNTERS(NAME_)
#undef NAME_
};
static long long counters[COUNTERS];
static int forbid_alloc;

static void count(int which)
{
    __atomic_add_fetch(&counters[which], 1, __ATOMIC_RELAXED);
}

/* Gauges: the largest value seen (reset with fake_cuda_reset_gauges). */
static void gauge_max(int which, long long v)
{
    long long old = __atomic_load_n(&counters[which], __ATOMIC_RELAXED);
    while (v > old && !__atomic_compare_exchange_n(&counters[which], &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

API void fake_cuda_reset_gauges(void)
{
    __atomic_store_n(&counters[COUNT_copy_entries_largest_piece], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&counters[COUNT_copy_entries_threads_per_entry], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&counters[COUNT_largest_host_alloc], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&counters[COUNT_largest_pinned_async_copy], 0, __ATOMIC_RELAXED);
}

API long long fake_cuda_count(const char *name)
{
    for (int i = 0; i < COUNTERS; i++)
        if (strcmp(name, counter_names[i]) == 0)
            return __atomic_load_n(&counters[i], __ATOMIC_RELAXED);
    return -1;
}

API void fake_cuda_forbid_alloc(int on)
{
    __atomic_store_n(&forbid_alloc, on, __ATOMIC_SEQ_CST);
}

__attribute__((constructor)) static void configure(void)
{
    const char *s = getenv("FAKE_LIBCUDA_STRICT");
    strict = !(s && strcmp(s, "0") == 0);
    const char *a = getenv("FAKE_LIBCUDA_SYNC_ALLOC");
    sync_alloc = strict && !(a && strcmp(a, "0") == 0);
    const char *d = getenv("FAKE_LIBCUDA_DEADLOCK_SECONDS");
    if (d && atof(d) > 0)
        deadlock_seconds = atof(d);
}

__attribute__((destructor)) static void print_counts(void)
{
    if (!getenv("FAKE_LIBCUDA_COUNTS"))
        return;
    fprintf(stderr, "fake libcuda %d.%d calls:", FAKE_CUDA_VERSION / 1000, FAKE_CUDA_VERSION % 1000 / 10);
    for (int i = 0; i < COUNTERS; i++)
        if (counters[i])
            fprintf(stderr, " %s=%lld", counter_names[i], counters[i]);
    fprintf(stderr, "\n");
}

/* ---- contexts: one primary context, a stack per thread ---- */
static int primary_refs;
static int primary_token;
static _Thread_local void *ctx_stack[16];
static _Thread_local int ctx_depth;

#define NEED_CONTEXT()                                                                  \
    do {                                                                                \
        if (in_host_fn)                                                                 \
            return NOT_PERMITTED;                                                       \
        if (!initialized)                                                               \
            return NOT_INITIALIZED;                                                     \
        if (ctx_depth == 0 || __atomic_load_n(&primary_refs, __ATOMIC_SEQ_CST) <= 0)    \
            return INVALID_CONTEXT;                                                     \
        int sticky_ = __atomic_load_n(&sticky, __ATOMIC_SEQ_CST);                       \
        if (sticky_)                                                                    \
            return sticky_;                                                             \
    } while (0)

/* Everything the context owns, under one lock. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- device allocations: for the illegal-address check ---- */
typedef struct range { uintptr_t start, end; } range;
static range *dev_allocs;
static size_t dev_count, dev_cap;

static size_t dev_find(uintptr_t a) /* first index with end > a */
{
    size_t lo = 0, hi = dev_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (dev_allocs[mid].end <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool dev_add(void *p, size_t n)
{
    pthread_mutex_lock(&registry_lock);
    bool ok = true;
    if (dev_count == dev_cap) {
        size_t cap = dev_cap ? dev_cap * 2 : 64;
        range *r = realloc(dev_allocs, cap * sizeof *r);
        if (r) {
            dev_allocs = r;
            dev_cap = cap;
        } else {
            ok = false;
        }
    }
    if (ok) {
        uintptr_t a = (uintptr_t)p;
        size_t i = dev_find(a);
        memmove(dev_allocs + i + 1, dev_allocs + i, (dev_count - i) * sizeof *dev_allocs);
        dev_allocs[i] = (range){a, a + (n ? n : 1)};
        dev_count++;
    }
    pthread_mutex_unlock(&registry_lock);
    return ok;
}

static bool dev_remove(uintptr_t a)
{
    pthread_mutex_lock(&registry_lock);
    size_t i = dev_find(a);
    bool found = i < dev_count && dev_allocs[i].start == a;
    if (found) {
        memmove(dev_allocs + i, dev_allocs + i + 1, (dev_count - i - 1) * sizeof *dev_allocs);
        dev_count--;
    }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

/* Is [p, p + n) inside one device allocation? */
static bool dev_valid(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&registry_lock);
    size_t i = dev_find(a);
    bool ok = i < dev_count && dev_allocs[i].start <= a && a + n <= dev_allocs[i].end;
    pthread_mutex_unlock(&registry_lock);
    return ok;
}

/* ---- page-locked host memory: what the back end got from us ---- */
typedef struct pinned { uintptr_t start; size_t bytes; bool allocated; void *base; } pinned;
static pinned pins[4096];
static int pin_count;

static bool is_pinned(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    bool found = false;
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < pin_count && !found; i++)
        found = a >= pins[i].start && a + n <= pins[i].start + pins[i].bytes;
    pthread_mutex_unlock(&registry_lock);
    return found;
}

static CUresult pin_add(void *p, size_t n, bool allocated, void *base)
{
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&registry_lock);
    CUresult r = pin_count < 4096 ? OK : OUT_OF_MEMORY;
    for (int i = 0; i < pin_count && r == OK; i++)
        if (a < pins[i].start + pins[i].bytes && pins[i].start < a + n)
            r = HOST_MEMORY_ALREADY_REGISTERED; /* overlapping or the same */
    if (r == OK)
        pins[pin_count++] = (pinned){a, n, allocated, base};
    pthread_mutex_unlock(&registry_lock);
    return r;
}

/* Removes the entry starting at p if it is `allocated` (or not); its base. */
static CUresult pin_remove(void *p, bool allocated, void **base)
{
    CUresult r = allocated ? INVALID_VALUE : HOST_MEMORY_NOT_REGISTERED;
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < pin_count; i++)
        if (pins[i].start == (uintptr_t)p && pins[i].allocated == allocated) {
            *base = pins[i].base;
            pins[i] = pins[--pin_count];
            r = OK;
            break;
        }
    pthread_mutex_unlock(&registry_lock);
    return r;
}

/* ---- events ---- */
typedef struct event {
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    bool            done, recorded;
    unsigned long long gen; /* of the latest cuEventRecord: as in CUDA, only it completes the event */
    double          ms;
    int             refs; /* the handle and each queued record or wait: as in
                             CUDA, destroying an event that queued work still
                             uses defers the release until that work is done */
} event;

static void event_release(event *e)
{
    pthread_mutex_lock(&e->lock);
    int left = --e->refs;
    pthread_mutex_unlock(&e->lock);
    if (left == 0) {
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->cond);
        free(e);
    }
}

#ifndef FAKE_CUDA_WITHOUT_STREAM_WAIT /* its only user is cuStreamWaitEvent */
static void event_retain(event *e)
{
    pthread_mutex_lock(&e->lock);
    e->refs++;
    pthread_mutex_unlock(&e->lock);
}
#endif

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* A record completes the event only if it is the latest one: an earlier
 * record still queued when the event was recorded again does not (CUDA:
 * the event's state is that of its most recent cuEventRecord). */
static void event_complete_record(event *e, unsigned long long gen)
{
    pthread_mutex_lock(&e->lock);
    if (gen != e->gen) {
        pthread_mutex_unlock(&e->lock);
        return;
    }
    e->done = true;
    e->ms = now_ms();
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->lock);
}

static void event_wait(event *e)
{
    pthread_mutex_lock(&e->lock);
    while (!e->done)
        pthread_cond_wait(&e->cond, &e->lock);
    pthread_mutex_unlock(&e->lock);
}

/* ---- the host-function thread: host functions of every stream, in turn ---- */
static pthread_mutex_t hostfn_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t  hostfn_cond = PTHREAD_COND_INITIALIZER;
static pthread_once_t  hostfn_once = PTHREAD_ONCE_INIT;
static host_fn         hostfn_fn;
static void           *hostfn_user;
static bool            hostfn_pending, hostfn_finished;

static void *hostfn_thread(void *arg)
{
    (void)arg;
    in_host_fn = true;
    pthread_mutex_lock(&hostfn_lock);
    for (;;) {
        while (!hostfn_pending)
            pthread_cond_wait(&hostfn_cond, &hostfn_lock);
        host_fn fn = hostfn_fn;
        void *user = hostfn_user;
        pthread_mutex_unlock(&hostfn_lock);
        fn(user);
        pthread_mutex_lock(&hostfn_lock);
        hostfn_pending = false;
        hostfn_finished = true;
        pthread_cond_broadcast(&hostfn_cond);
    }
    return NULL;
}

static void hostfn_start(void)
{
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_create(&t, &attr, hostfn_thread, NULL);
    pthread_attr_destroy(&attr);
}

/* Runs fn(user) on the driver's one host-function thread (strict), else on
 * the stream's own thread. */
static void run_host_fn(host_fn fn, void *user)
{
    if (!strict) {
        in_host_fn = true;
        fn(user);
        in_host_fn = false;
        return;
    }
    pthread_once(&hostfn_once, hostfn_start);
    pthread_mutex_lock(&hostfn_lock);
    while (hostfn_pending || hostfn_finished) /* another stream's turn */
        pthread_cond_wait(&hostfn_cond, &hostfn_lock);
    hostfn_fn = fn;
    hostfn_user = user;
    hostfn_pending = true;
    pthread_cond_broadcast(&hostfn_cond);
    while (!hostfn_finished)
        pthread_cond_wait(&hostfn_cond, &hostfn_lock);
    hostfn_finished = false;
    pthread_cond_broadcast(&hostfn_cond);
    pthread_mutex_unlock(&hostfn_lock);
}

/* ---- streams: a worker thread each, the legacy stream too ---- */
typedef enum { OP_COPY, OP_SET, OP_HOST_FN, OP_RECORD, OP_WAIT, OP_KERNEL, OP_SAXPY, OP_JACOBI, OP_DIFF, OP_FAULT } op_kind;
typedef struct op {
    struct op  *next;
    op_kind     kind;
    void       *dst;
    const void *src;
    size_t      bytes;
    int         value;
    host_fn     fn;
    void       *user;
    event      *ev;
    void       *owned; /* freed after the op ran (a pageable source copied at submit) */
    size_t      split;  /* OP_KERNEL: bytes per piece (0: the old kernel, a block per whole entry) */
    unsigned    pieces; /* OP_KERNEL: gridDim.y, pieces per entry at most */
} op;

typedef struct stream {
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    op             *head, *tail;
    bool            busy, quit;
    pthread_t       thread;
    struct stream  *next_live;
    int             visitors; /* under registry_lock: threads waiting for it in synchronize_all_streams */
} stream;

static stream *live_streams; /* under registry_lock; the legacy stream included */
static int legacy_held;      /* fake_cuda_hold_legacy */
static pthread_cond_t visitors_gone = PTHREAD_COND_INITIALIZER;
static stream *legacy;       /* created with the context */

/* The special handles (cuda.h: CU_STREAM_LEGACY, CU_STREAM_PER_THREAD). */
#define LEGACY_HANDLE ((stream *)(uintptr_t)0x1)
#define PER_THREAD_HANDLE ((stream *)(uintptr_t)0x2)
static bool stream_live(stream *s);

/* A CUstream argument: 0 and the special handles are the legacy stream;
 * anything else must be a live stream. */
#define STREAM_ARG(s)                                                        \
    do {                                                                     \
        if (!(s) || (s) == LEGACY_HANDLE || (s) == PER_THREAD_HANDLE)        \
            (s) = legacy;                                                    \
        else if (!stream_live(s))                                            \
            return INVALID_HANDLE;                                           \
    } while (0)

typedef struct { unsigned long long staging_offset, buffer_offset, bytes; } entry;

static void set_sticky(int code)
{
    int none = 0;
    __atomic_compare_exchange_n(&sticky, &none, code, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

/* The back end's mapping_copy_entries kernel: dst = buffer, src = staging,
 * user = the table (read when the kernel runs, as on a GPU), bytes = count,
 * value = gather. With split (the kernel that cuts entries into pieces):
 * piece y of each entry is [y * split, +split), for y < pieces, as the
 * kernel's blockIdx.y does: bytes beyond pieces * split are never copied.
 * The gauges record how much of one entry one warp (or, for the old kernel,
 * one 256-thread block) copies, and the threads given to an entry. */
static void run_copy_entries(op *o)
{
    const entry *table = o->user;
    if (!dev_valid(table, o->bytes * sizeof *table)) {
        set_sticky(ILLEGAL_ADDRESS);
        return;
    }
    for (size_t i = 0; i < o->bytes; i++) {
        unsigned char *at_staging = (unsigned char *)o->src + table[i].staging_offset;
        unsigned char *at_buffer = (unsigned char *)o->dst + table[i].buffer_offset;
        if (!dev_valid(at_staging, table[i].bytes) || !dev_valid(at_buffer, table[i].bytes)) {
            set_sticky(ILLEGAL_ADDRESS);
            return;
        }
        if (!o->split) { /* the old kernel: the whole entry by one block */
            gauge_max(COUNT_copy_entries_largest_piece, (long long)table[i].bytes);
            if (o->value)
                memmove(at_staging, at_buffer, table[i].bytes);
            else
                memmove(at_buffer, at_staging, table[i].bytes);
            continue;
        }
        for (unsigned y = 0; y < o->pieces; y++) {
            size_t lo = (size_t)y * o->split;
            if (lo >= table[i].bytes)
                break;
            size_t n = table[i].bytes - lo < o->split ? table[i].bytes - lo : o->split;
            gauge_max(COUNT_copy_entries_largest_piece, (long long)n);
            if (o->value)
                memmove(at_staging + lo, at_buffer + lo, n);
            else
                memmove(at_buffer + lo, at_staging + lo, n);
        }
    }
}

/* examples/kernels/jacobi.cu: src = u, dst = v, user = its jacobi_args. */
typedef struct { unsigned cols, first_row, rows, owned, halo; } jacobi_args;
static void run_jacobi(op *o)
{
    const jacobi_args *a = o->user;
    const float *u = o->src;
    float *v = o->dst;
    for (size_t i = 0; i < a->owned; i++) {
        size_t g = a->first_row + i;
        if (g == 0 || g + 1 == a->rows)
            continue;
        for (size_t j = 1; j + 1 < a->cols; j++) {
            size_t k = (i + a->halo) * a->cols + j;
            v[k] = 0.25f * (((u[k - a->cols] + u[k + a->cols]) + u[k - 1]) + u[k + 1]);
        }
    }
}

static void run_op(op *o)
{
    bool skip = __atomic_load_n(&sticky, __ATOMIC_SEQ_CST) != 0; /* the context is broken: nothing runs */
    switch (o->kind) {
    case OP_COPY: if (!skip) memmove(o->dst, o->src, o->bytes); break;
    case OP_SET: if (!skip) memset(o->dst, o->value, o->bytes); break;
    case OP_HOST_FN: if (!skip) run_host_fn(o->fn, o->user); break;
    case OP_RECORD: event_complete_record(o->ev, o->bytes); event_release(o->ev); break;
    case OP_WAIT: event_wait(o->ev); event_release(o->ev); break;
    case OP_KERNEL: if (!skip) run_copy_entries(o); break;
    case OP_SAXPY: /* examples/kernels/scale.cu: y = a*x + y; value = a, src = x, dst = y, bytes = n */
        if (skip)
            break;
        for (size_t i = 0; i < o->bytes; i++)
            ((float *)o->dst)[i] = (float)o->value * ((const float *)o->src)[i] + ((float *)o->dst)[i];
        break;
    case OP_JACOBI: if (!skip) run_jacobi(o); break;
    case OP_DIFF: /* the back end's mapping_diff_blocks: src = mem, dst = shadow, user = flags, bytes = blocks */
        if (skip)
            break;
        for (size_t b = 0; b < o->bytes; b++) {
            const char *a = (const char *)o->src + b * 4096;
            char *sh = (char *)o->dst + b * 4096;
            int changed = memcmp(a, sh, 4096) != 0;
            if (changed)
                memcpy(sh, a, 4096);
            ((unsigned char *)o->user)[b] = (unsigned char)changed;
        }
        break;
    case OP_FAULT: set_sticky(ILLEGAL_ADDRESS); break;
    }
    free(o->owned);
}

static void *worker(void *arg)
{
    stream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while ((!s->head || (s == legacy && __atomic_load_n(&legacy_held, __ATOMIC_SEQ_CST))) && !s->quit)
            pthread_cond_wait(&s->cond, &s->lock);
        if (!s->head)
            break;
        op *o = s->head;
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        s->busy = true;
        pthread_mutex_unlock(&s->lock);
        run_op(o);
        free(o);
        pthread_mutex_lock(&s->lock);
        s->busy = false;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

API void fake_cuda_hold_legacy(int on)
{
    __atomic_store_n(&legacy_held, on, __ATOMIC_SEQ_CST);
    stream *l = legacy;
    if (!on && l) {
        pthread_mutex_lock(&l->lock);
        pthread_cond_broadcast(&l->cond);
        pthread_mutex_unlock(&l->lock);
    }
}

static stream *stream_new(void)
{
    stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    pthread_create(&s->thread, NULL, worker, s);
    pthread_mutex_lock(&registry_lock);
    s->next_live = live_streams;
    live_streams = s;
    pthread_mutex_unlock(&registry_lock);
    return s;
}

static bool stream_live(stream *s)
{
    pthread_mutex_lock(&registry_lock);
    stream *l = live_streams;
    while (l && l != s)
        l = l->next_live;
    pthread_mutex_unlock(&registry_lock);
    return l != NULL;
}

/* Stops the worker after its queued work and frees the stream. */
static void stream_end(stream *s)
{
    pthread_mutex_lock(&registry_lock);
    for (stream **p = &live_streams; *p; p = &(*p)->next_live)
        if (*p == s) {
            *p = s->next_live;
            break;
        }
    while (s->visitors > 0) /* another thread waits for it: let it finish */
        pthread_cond_wait(&visitors_gone, &registry_lock);
    pthread_mutex_unlock(&registry_lock);
    pthread_mutex_lock(&s->lock);
    s->quit = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
}

static CUresult submit(stream *s, op o)
{
    if (!s)
        s = legacy;
    op *p = malloc(sizeof *p);
    if (!p) {
        free(o.owned);
        return OUT_OF_MEMORY;
    }
    *p = o;
    p->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->tail)
        s->tail->next = p;
    else
        s->head = p;
    s->tail = p;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return OK;
}

/* Waits until the stream is idle; false when that took longer than `limit`
 * seconds (limit <= 0: no limit). */
static bool drain_within(stream *s, double limit)
{
    if (!s)
        s = legacy;
    double until = now_ms() + limit * 1e3;
    bool idle = true;
    pthread_mutex_lock(&s->lock);
    while ((s->head || s->busy) && idle) {
        if (limit <= 0) {
            pthread_cond_wait(&s->cond, &s->lock);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&s->cond, &s->lock, &ts) == ETIMEDOUT && now_ms() > until)
            idle = false;
    }
    pthread_mutex_unlock(&s->lock);
    return idle;
}

static void drain(stream *s)
{
    drain_within(s, 0);
}

/* What a real driver does in a free, and may do in an allocation: wait for
 * all work of the context. A wait that does not end is a hang on a GPU: abort. */
static void synchronize_all_streams(const char *call)
{
    if (!strict)
        return;
    pthread_mutex_lock(&registry_lock);
    size_t n = 0;
    for (stream *s = live_streams; s; s = s->next_live)
        n++;
    stream **all = malloc((n ? n : 1) * sizeof *all);
    n = 0;
    for (stream *s = live_streams; s && all; s = s->next_live) {
        s->visitors++; /* kept alive until we are done with it */
        all[n++] = s;
    }
    pthread_mutex_unlock(&registry_lock);
    for (size_t i = 0; i < n; i++) {
        if (!drain_within(all[i], deadlock_seconds)) {
            fprintf(stderr,
                    "fake libcuda: %s waited %.0f s for a stream that does not finish (a host function waiting for "
                    "the caller?): a real driver, which synchronizes allocations and frees with every stream, "
                    "hangs here\n",
                    call, deadlock_seconds);
            abort();
        }
    }
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < n; i++)
        all[i]->visitors--;
    pthread_cond_broadcast(&visitors_gone);
    pthread_mutex_unlock(&registry_lock);
    free(all);
}

/* The start of every allocation (is_free false) and free. */
#define ALLOCATION(name, is_free)                                                            \
    do {                                                                                     \
        NEED_CONTEXT();                                                                      \
        count(COUNT_##name);                                                                 \
        if (__atomic_load_n(&forbid_alloc, __ATOMIC_SEQ_CST)) {                              \
            count(COUNT_forbidden);                                                          \
            fprintf(stderr, "fake libcuda: %s called where the test forbids allocations\n", #name); \
            return NOT_PERMITTED;                                                            \
        }                                                                                    \
        if ((is_free) || sync_alloc)                                                         \
            synchronize_all_streams(#name);                                                  \
    } while (0)

/* ---- the primary context's life ---- */

static void context_create(void)
{
    __atomic_store_n(&sticky, 0, __ATOMIC_SEQ_CST);
    legacy = stream_new();
}

/* Refcount 0: everything the context owned goes. */
static void context_reset(void)
{
    count(COUNT_context_resets);
    function_loaded = saxpy_loaded = jacobi_loaded = false; /* the modules are gone */
    long long leaked = 0;
    for (;;) {
        pthread_mutex_lock(&registry_lock);
        stream *s = live_streams;
        pthread_mutex_unlock(&registry_lock);
        if (!s)
            break;
        if (s != legacy)
            leaked++;
        drain(s);
        stream_end(s);
    }
    legacy = NULL;
    pthread_mutex_lock(&registry_lock);
    leaked += (long long)dev_count;
    for (size_t i = 0; i < dev_count; i++)
        free((void *)dev_allocs[i].start);
    dev_count = 0;
    for (int i = 0; i < pin_count; i++) {
        leaked++;
        if (pins[i].allocated)
            free(pins[i].base);
    }
    pin_count = 0;
    pthread_mutex_unlock(&registry_lock);
    if (leaked) {
        __atomic_add_fetch(&counters[COUNT_leaked_at_reset], leaked, __ATOMIC_RELAXED);
        fprintf(stderr, "fake libcuda: the primary context reset with %lld streams, allocations or registrations "
                        "still live (now gone)\n", leaked);
    }
    __atomic_store_n(&sticky, 0, __ATOMIC_SEQ_CST);
}

/* ---- the API ---- */

API CUresult cuInit(unsigned flags) { (void)flags; initialized = true; return OK; }
API CUresult cuDriverGetVersion(int *v) { *v = FAKE_CUDA_VERSION; return OK; }
API CUresult cuDeviceGetCount(int *n) { if (!initialized) return NOT_INITIALIZED; *n = 1; return OK; }
API CUresult cuDeviceGet(int *d, int i) { if (i != 0) return INVALID_DEVICE; *d = 0; return OK; }
API CUresult cuDeviceGetName(char *name, int len, int d)
{
    (void)d;
    snprintf(name, (size_t)len, "Fake CUDA %d.%d device (tests/fake/fake_libcuda.c)", FAKE_CUDA_VERSION / 1000,
             FAKE_CUDA_VERSION % 1000 / 10);
    return OK;
}
API CUresult cuDeviceTotalMem_v2(size_t *bytes, int d) { (void)d; *bytes = (size_t)1 << 30; return OK; }
API CUresult cuDeviceGetAttribute(int *v, int attr, int d)
{
    (void)d;
    switch (attr) {
    case 75: *v = 7; break; /* compute capability 7.5 */
    case 76: *v = 5; break;
    case 83: case 89: case 99: *v = 1; break; /* managed, concurrent managed, host register */
    default: *v = 0;
    }
    return OK;
}

static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;
API CUresult cuDevicePrimaryCtxRetain(void **ctx, int d)
{
    if (!initialized)
        return NOT_INITIALIZED;
    if (d != 0)
        return INVALID_DEVICE;
    pthread_mutex_lock(&primary_lock);
    if (primary_refs == 0)
        context_create();
    __atomic_add_fetch(&primary_refs, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&primary_lock);
    *ctx = &primary_token;
    return OK;
}
API CUresult cuDevicePrimaryCtxRelease_v2(int d)
{
    if (d != 0)
        return INVALID_DEVICE;
    pthread_mutex_lock(&primary_lock);
    CUresult r = primary_refs > 0 ? OK : INVALID_CONTEXT;
    if (r == OK && __atomic_sub_fetch(&primary_refs, 1, __ATOMIC_SEQ_CST) == 0)
        context_reset();
    pthread_mutex_unlock(&primary_lock);
    return r;
}
API CUresult cuCtxGetCurrent(void **ctx) { *ctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; return OK; }
API CUresult cuCtxPushCurrent_v2(void *ctx)
{
    if (ctx != &primary_token || ctx_depth == 16)
        return INVALID_CONTEXT;
    ctx_stack[ctx_depth++] = ctx;
    return OK;
}
API CUresult cuCtxPopCurrent_v2(void **ctx)
{
    if (!ctx_depth)
        return INVALID_CONTEXT;
    *ctx = ctx_stack[--ctx_depth];
    return OK;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    ALLOCATION(cuMemAlloc, false);
    void *m = malloc(n ? n : 1);
    if (!m)
        return OUT_OF_MEMORY;
    if (!dev_add(m, n)) {
        free(m);
        return OUT_OF_MEMORY;
    }
    *p = (uintptr_t)m;
    return OK;
}
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f)
{
    (void)f;
    ALLOCATION(cuMemAllocManaged, false);
    void *m = malloc(n ? n : 1);
    if (!m)
        return OUT_OF_MEMORY;
    if (!dev_add(m, n)) {
        free(m);
        return OUT_OF_MEMORY;
    }
    *p = (uintptr_t)m;
    return OK;
}
API CUresult cuMemFree_v2(CUdeviceptr p)
{
    ALLOCATION(cuMemFree, true);
    if (!dev_remove((uintptr_t)p))
        return INVALID_VALUE;
    free((void *)(uintptr_t)p);
    return OK;
}
API CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags)
{
    (void)flags;
    ALLOCATION(cuMemHostAlloc, false);
    gauge_max(COUNT_largest_host_alloc, (long long)n);
    /* Blocks 64 bytes past a page boundary: every second one when strict,
     * all with FAKE_LIBCUDA_MISALIGN_HOST=1. */
    static unsigned long calls;
    bool misalign = getenv("FAKE_LIBCUDA_MISALIGN_HOST") ||
                    (strict && __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED) % 2 == 1);
    size_t skew = misalign ? 64 : 0;
    void *base;
    if (posix_memalign(&base, 4096, n + skew))
        return OUT_OF_MEMORY;
    *p = (char *)base + skew;
    CUresult r = pin_add(*p, n, true, base);
    if (r != OK)
        free(base);
    return r;
}
API CUresult cuMemFreeHost(void *p)
{
    ALLOCATION(cuMemFreeHost, true);
    void *base = NULL;
    CUresult r = pin_remove(p, true, &base);
    if (r == OK)
        free(base);
    return r;
}
API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f)
{
    (void)f;
    ALLOCATION(cuMemHostRegister, false);
    if (!p || !n)
        return INVALID_VALUE;
    return pin_add(p, n, false, NULL);
}
API CUresult cuMemHostUnregister(void *p)
{
    ALLOCATION(cuMemHostUnregister, true);
    void *base;
    return pin_remove(p, false, &base);
}

#define D(p) ((void *)(uintptr_t)(p))

/* A device range the work touches; false makes the context's error sticky. */
static bool device_ok(CUdeviceptr p, size_t n)
{
    if (dev_valid(D(p), n))
        return true;
    set_sticky(ILLEGAL_ADDRESS);
    return false;
}

/* A queued access of [p, +n): checked when the stream gets there. */
static CUresult submit_checked(stream *s, op o, CUdeviceptr a, size_t an, CUdeviceptr b, size_t bn)
{
    if (!dev_valid(D(a), an) || (bn && !dev_valid(D(b), bn))) {
        free(o.owned);
        return submit(s, (op){.kind = OP_FAULT});
    }
    return submit(s, o);
}

/* Blocking calls ("API synchronization behavior"). */
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n)
{
    NEED_CONTEXT();
    count(COUNT_cuMemcpyHtoD);
    drain(NULL);
    if (!device_ok(d, n))
        return ILLEGAL_ADDRESS;
    if (is_pinned(s, n)) { /* synchronous */
        memcpy(D(d), s, n);
        return OK;
    }
    /* Pageable: returns once the source is staged; the DMA may go on. */
    void *staged = malloc(n);
    if (!staged)
        return OUT_OF_MEMORY;
    memcpy(staged, s, n);
    return submit(NULL, (op){.kind = OP_COPY, .dst = D(d), .src = staged, .bytes = n, .owned = staged});
}
API CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n)
{
    NEED_CONTEXT();
    count(COUNT_cuMemcpyDtoH);
    drain(NULL);
    if (!device_ok(s, n))
        return ILLEGAL_ADDRESS;
    memcpy(d, D(s), n); /* returns once done */
    return OK;
}
API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    NEED_CONTEXT(); /* asynchronous to the host */
    return submit_checked(NULL, (op){.kind = OP_COPY, .dst = D(d), .src = D(s), .bytes = n}, d, n, s, n);
}
API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
    NEED_CONTEXT(); /* asynchronous to the host for device memory */
    return submit_checked(NULL, (op){.kind = OP_SET, .dst = D(d), .value = v, .bytes = n}, d, n, 0, 0);
}

/* Pageable memory: like the real driver, wait for the stream, then copy. */
static CUresult host_copy_async(void *dst, const void *src, size_t n, stream *s, const void *host, CUdeviceptr dev)
{
    if (!is_pinned(host, n)) {
        drain(s);
        if (!device_ok(dev, n))
            return ILLEGAL_ADDRESS;
        memcpy(dst, src, n);
        return OK;
    }
    gauge_max(COUNT_largest_pinned_async_copy, (long long)n);
    return submit_checked(s, (op){.kind = OP_COPY, .dst = dst, .src = src, .bytes = n}, dev, n, 0, 0);
}
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, stream *st)
{
    NEED_CONTEXT();
    count(COUNT_cuMemcpyHtoDAsync);
    STREAM_ARG(st);
    return host_copy_async(D(d), s, n, st, s, d);
}
API CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, stream *st)
{
    NEED_CONTEXT();
    count(COUNT_cuMemcpyDtoHAsync);
    STREAM_ARG(st);
    return host_copy_async(d, D(s), n, st, d, s);
}
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, stream *st)
{
    NEED_CONTEXT();
    STREAM_ARG(st);
    return submit_checked(st, (op){.kind = OP_COPY, .dst = D(d), .src = D(s), .bytes = n}, d, n, s, n);
}
API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, stream *st)
{
    NEED_CONTEXT();
    STREAM_ARG(st);
    return submit_checked(st, (op){.kind = OP_SET, .dst = D(d), .value = v, .bytes = n}, d, n, 0, 0);
}
/* One device: peer access to itself is refused, as the driver does. */
API CUresult cuDeviceCanAccessPeer(int *can, int d, int peer) { (void)d; (void)peer; *can = 0; return OK; }
API CUresult cuCtxEnablePeerAccess(void *peer, unsigned f) { (void)peer; (void)f; NEED_CONTEXT(); return 1; }
API CUresult cuMemcpyPeerAsync(CUdeviceptr d, void *dctx, CUdeviceptr s, void *sctx, size_t n, stream *st)
{
    NEED_CONTEXT();
    STREAM_ARG(st);
    if (dctx != &primary_token || sctx != &primary_token)
        return INVALID_CONTEXT;
    return submit_checked(st, (op){.kind = OP_COPY, .dst = D(d), .src = D(s), .bytes = n}, d, n, s, n);
}

API CUresult cuStreamCreate(stream **out, unsigned flags)
{
    (void)flags;
    NEED_CONTEXT();
    count(COUNT_cuStreamCreate);
    stream *s = stream_new();
    if (!s)
        return OUT_OF_MEMORY;
    *out = s;
    return OK;
}
API CUresult cuStreamSynchronize(stream *s)
{
    NEED_CONTEXT();
    count(COUNT_cuStreamSynchronize);
    if (s == LEGACY_HANDLE)
        count(COUNT_cuStreamSynchronize_legacy);
    STREAM_ARG(s);
    drain(s);
    int e = __atomic_load_n(&sticky, __ATOMIC_SEQ_CST);
    return e ? e : OK;
}
API CUresult cuStreamDestroy_v2(stream *s)
{
    NEED_CONTEXT();
    if (!s || s == LEGACY_HANDLE || s == PER_THREAD_HANDLE || s == legacy || !stream_live(s))
        return INVALID_HANDLE; /* the default streams are never destroyed */
    stream_end(s); /* like CUDA: queued work still completes */
    return OK;
}
API CUresult cuLaunchHostFunc(stream *s, host_fn fn, void *user)
{
    NEED_CONTEXT();
    count(COUNT_cuLaunchHostFunc);
    STREAM_ARG(s);
    return submit(s, (op){.kind = OP_HOST_FN, .fn = fn, .user = user});
}

API CUresult cuEventCreate(event **out, unsigned flags)
{
    (void)flags;
    NEED_CONTEXT();
    event *e = calloc(1, sizeof *e);
    if (!e)
        return OUT_OF_MEMORY;
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->cond, NULL);
    e->done = true; /* an event never recorded counts as complete */
    e->refs = 1;
    *out = e;
    return OK;
}
/* After a sticky error the call fails, but the event is gone all the same
 * (a real driver frees it with the context, which must reset). */
API CUresult cuEventDestroy_v2(event *e)
{
    int sticky_now = __atomic_load_n(&sticky, __ATOMIC_SEQ_CST);
    if (sticky_now && !in_host_fn && ctx_depth > 0 && e) {
        event_release(e);
        return sticky_now;
    }
    NEED_CONTEXT();
    event_release(e);
    return OK;
}
API CUresult cuEventRecord(event *e, stream *s)
{
    NEED_CONTEXT();
    STREAM_ARG(s);
    pthread_mutex_lock(&e->lock);
    e->done = false;
    e->recorded = true;
    e->refs++;
    unsigned long long gen = ++e->gen;
    pthread_mutex_unlock(&e->lock);
    CUresult r = submit(s, (op){.kind = OP_RECORD, .ev = e, .bytes = (size_t)gen});
    if (r != OK)
        event_release(e);
    return r;
}
API CUresult cuEventQuery(event *e)
{
    NEED_CONTEXT();
    pthread_mutex_lock(&e->lock);
    bool done = e->done;
    pthread_mutex_unlock(&e->lock);
    return done ? OK : NOT_READY;
}
API CUresult cuEventSynchronize(event *e)
{
    NEED_CONTEXT();
    count(COUNT_cuEventSynchronize);
    event_wait(e);
    int s = __atomic_load_n(&sticky, __ATOMIC_SEQ_CST);
    return s ? s : OK;
}
/* FAKE_CUDA_WITHOUT_STREAM_WAIT builds a driver that lacks one required
 * entry point (tests: the back end must refuse it, naming the symbol). */
#ifndef FAKE_CUDA_WITHOUT_STREAM_WAIT
API CUresult cuStreamWaitEvent(stream *s, event *e, unsigned f)
{
    (void)f;
    NEED_CONTEXT();
    STREAM_ARG(s);
    event_retain(e);
    CUresult r = submit(s, (op){.kind = OP_WAIT, .ev = e});
    if (r != OK)
        event_release(e);
    return r;
}
#endif

static CUresult elapsed(float *ms, event *a, event *b)
{
    NEED_CONTEXT();
    pthread_mutex_lock(&a->lock);
    bool a_recorded = a->recorded;
    pthread_mutex_unlock(&a->lock);
    pthread_mutex_lock(&b->lock);
    bool b_recorded = b->recorded;
    pthread_mutex_unlock(&b->lock);
    if (!a_recorded || !b_recorded)
        return INVALID_HANDLE; /* as the driver: cuEventRecord never called on one */
    if (cuEventQuery(a) != OK || cuEventQuery(b) != OK)
        return NOT_READY;
    *ms = (float)(b->ms - a->ms);
    return OK;
}
API CUresult cuEventElapsedTime(float *ms, event *a, event *b)
{
    count(COUNT_cuEventElapsedTime);
    return elapsed(ms, a, b);
}

typedef struct { int type, id; } location;
typedef struct { int order; location src, dst; unsigned flags; } copy_attrs;

/* The batch copy, shared by both signatures. */
static CUresult batch_copy(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count_, copy_attrs *attrs,
                           size_t *idxs, size_t nattrs, size_t *fail_idx, stream *s)
{
    NEED_CONTEXT();
    if (!s || s == LEGACY_HANDLE || !attrs || !idxs || nattrs == 0 || idxs[0] != 0 || attrs[0].order != 1) {
        if (fail_idx)
            *fail_idx = SIZE_MAX; /* an error not tied to one copy */
        return INVALID_VALUE; /* the real call refuses the legacy stream, and needs an order */
    }
    STREAM_ARG(s);
    for (size_t i = 0; i < count_; i++) {
        CUresult r = submit_checked(s, (op){.kind = OP_COPY, .dst = D(dsts[i]), .src = D(srcs[i]), .bytes = sizes[i]},
                                    dsts[i], sizes[i], srcs[i], sizes[i]);
        if (r != OK) {
            if (fail_idx)
                *fail_idx = i;
            return r;
        }
    }
    return OK;
}

/* CUDA 12.8: with failIdx. A CUDA 13 driver still exports it. */
API CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count_,
                                copy_attrs *attrs, size_t *idxs, size_t nattrs, size_t *fail_idx, stream *s)
{
    count(COUNT_cuMemcpyBatchAsync);
    if (!fail_idx)
        return INVALID_VALUE;
    return batch_copy(dsts, srcs, sizes, count_, attrs, idxs, nattrs, fail_idx, s);
}

/* The CUDA 8 prefetch (its 12.x name; CUDA 13 maps the name to _v2). */
API CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t n, int to, stream *s)
{
    NEED_CONTEXT();
    count(COUNT_cuMemPrefetchAsync);
    STREAM_ARG(s);
    if (to != -1 && to != 0)
        return INVALID_DEVICE;
    return submit_checked(s, (op){.kind = OP_SET, .bytes = 0, .dst = D(p)}, p, n, 0, 0);
}

#if FAKE_CUDA_VERSION >= 13000
API CUresult cuEventElapsedTime_v2(float *ms, event *a, event *b)
{
    count(COUNT_cuEventElapsedTime_v2);
    return elapsed(ms, a, b);
}

API CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, location to, unsigned f, stream *s)
{
    NEED_CONTEXT();
    count(COUNT_cuMemPrefetchAsync_v2);
    STREAM_ARG(s);
    if (f != 0 || (to.type != 1 && to.type != 2) || (to.type == 1 && to.id != 0))
        return INVALID_VALUE;
    return submit_checked(s, (op){.kind = OP_SET, .bytes = 0, .dst = D(p)}, p, n, 0, 0);
}

API CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count_,
                                   copy_attrs *attrs, size_t *idxs, size_t nattrs, stream *s)
{
    count(COUNT_cuMemcpyBatchAsync_v2);
    return batch_copy(dsts, srcs, sizes, count_, attrs, idxs, nattrs, NULL, s);
}
#endif

/* Modules: the back end's kernel and the examples' saxpy and jacobi, emulated on the stream. */
static int module_token, function_token, saxpy_token, jacobi_token, diff_token;
static bool module_has_diff; /* the back end's module carries mapping_diff_blocks */
static bool *loaded_flag(void *fn)
{
    return fn == &function_token ? &function_loaded : fn == &saxpy_token ? &saxpy_loaded
                                                     : fn == &jacobi_token ? &jacobi_loaded
                                                     : fn == &diff_token   ? &diff_loaded : NULL;
}
API CUresult cuModuleLoadData(void **module, const void *image)
{
    NEED_CONTEXT();
    count(COUNT_cuModuleLoadData);
    synchronize_all_streams("cuModuleLoadData (loading a module may synchronize the context)");
    if (!strstr(image, ".entry mapping_copy_entries") && !strstr(image, ".entry saxpy") &&
        !strstr(image, ".entry jacobi("))
        return 218; /* CUDA_ERROR_INVALID_PTX */
    if (strstr(image, ".entry mapping_copy_entries")) {
        copy_entries_split = strstr(image, "mapping_copy_entries_param_5") != NULL;
        module_has_diff = strstr(image, ".entry mapping_diff_blocks") != NULL;
    }
    *module = &module_token;
    return OK;
}
API CUresult cuModuleUnload(void *module) { NEED_CONTEXT(); return module == &module_token ? OK : INVALID_HANDLE; }
API CUresult cuModuleGetFunction(void **fn, void *module, const char *name)
{
    NEED_CONTEXT();
    if (module != &module_token)
        return NOT_FOUND;
    if (strcmp(name, "mapping_copy_entries") == 0)
        *fn = &function_token;
    else if (strcmp(name, "saxpy") == 0)
        *fn = &saxpy_token;
    else if (strcmp(name, "jacobi") == 0)
        *fn = &jacobi_token;
    else if (strcmp(name, "mapping_diff_blocks") == 0 && module_has_diff)
        *fn = &diff_token;
    else
        return NOT_FOUND;
    return OK;
}

API CUresult cuFuncLoad(void *fn)
{
    NEED_CONTEXT();
    count(COUNT_cuFuncLoad);
    bool *flag = loaded_flag(fn);
    if (!flag)
        return INVALID_HANDLE;
    *flag = true;
    return OK;
}

API CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shared, stream *s, void **params, void **extra)
{
    bool *flag = loaded_flag(fn);
    if (flag && !*flag && ctx_depth) { /* lazy loading: the first launch loads the function */
        count(COUNT_lazy_loads);
        synchronize_all_streams("cuLaunchKernel (the first launch of a function loads it lazily, which may "
                                "synchronize the context)");
        *flag = true;
    }
    (void)shared, (void)extra;
    NEED_CONTEXT();
    count(COUNT_cuLaunchKernel);
    STREAM_ARG(s);
    if ((fn != &function_token && fn != &saxpy_token && fn != &jacobi_token && fn != &diff_token) || gx == 0 ||
        gy == 0 || gz == 0 ||
        bx == 0 || by == 0 || bz == 0 || (unsigned long long)bx * by * bz > 1024)
        return INVALID_VALUE;
    if (fn == &jacobi_token) { /* u, v, cols, first_row, rows, owned, halo; the grid must cover the block */
        CUdeviceptr u = *(CUdeviceptr *)params[0], v = *(CUdeviceptr *)params[1];
        jacobi_args *a = malloc(sizeof *a);
        if (!a)
            return OUT_OF_MEMORY;
        *a = (jacobi_args){*(unsigned *)params[2], *(unsigned *)params[3], *(unsigned *)params[4],
                           *(unsigned *)params[5], *(unsigned *)params[6]};
        if ((unsigned long long)gx * bx < a->cols || (unsigned long long)gy * by < a->owned) {
            free(a);
            return INVALID_VALUE; /* a real launch would leave cells out: refuse it here */
        }
        size_t n = (size_t)(a->owned + 2 * a->halo) * a->cols * sizeof(float);
        return submit_checked(s, (op){.kind = OP_JACOBI, .src = D(u), .dst = D(v), .user = a, .owned = a}, u, n, v, n);
    }
    if (fn == &diff_token) { /* mem, shadow, flags, blocks; the grid must cover the blocks */
        CUdeviceptr a = *(CUdeviceptr *)params[0], sh = *(CUdeviceptr *)params[1], fl = *(CUdeviceptr *)params[2];
        unsigned long long blocks = *(unsigned long long *)params[3];
        if ((unsigned long long)gx * gy < blocks)
            return INVALID_VALUE; /* a real launch would leave blocks out: refuse it here */
        if (!dev_valid(D(fl), blocks))
            return submit(s, (op){.kind = OP_FAULT});
        return submit_checked(s, (op){.kind = OP_DIFF, .src = D(a), .dst = D(sh), .user = D(fl), .bytes = blocks}, a,
                              blocks * 4096, sh, blocks * 4096);
    }
    if (fn == &saxpy_token) { /* whole numbers only: the example's a is 2 */
        CUdeviceptr x = *(CUdeviceptr *)params[1], y = *(CUdeviceptr *)params[2];
        size_t n = *(unsigned *)params[3];
        return submit_checked(s, (op){.kind = OP_SAXPY, .value = (int)*(float *)params[0], .src = D(x), .dst = D(y),
                                      .bytes = n},
                              x, n * sizeof(float), y, n * sizeof(float));
    }
    CUdeviceptr table = *(CUdeviceptr *)params[1];
    if (table % 8)
        return 716; /* CUDA_ERROR_MISALIGNED_ADDRESS */
    size_t split = 0;
    if (copy_entries_split) { /* a warp per entry: whole warps only */
        split = (size_t)*(unsigned long long *)params[5];
        if (split == 0 || bx % 32 != 0)
            return INVALID_VALUE;
        gauge_max(COUNT_copy_entries_threads_per_entry, 32);
    } else {
        gauge_max(COUNT_copy_entries_threads_per_entry, (long long)bx);
    }
    return submit(s, (op){.kind = OP_KERNEL, .src = D(*(CUdeviceptr *)params[0]), .user = D(table),
                          .bytes = (size_t)*(unsigned long long *)params[2], .dst = D(*(CUdeviceptr *)params[3]),
                          .value = (int)*(unsigned *)params[4], .split = split, .pieces = gy});
}
