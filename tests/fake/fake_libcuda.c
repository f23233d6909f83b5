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
 * - The legacy stream (0) of each context runs asynchronously on its own
 *   thread; the blocking calls behave as documented ("API synchronization
 *   behavior"): cuMemcpyHtoD from pageable memory and cuMemcpyDtoD /
 *   cuMemsetD8 return before the copy is done; an Async copy to or from
 *   pageable memory waits for its stream first. Streams created without
 *   CU_STREAM_NON_BLOCKING synchronize with the legacy stream both ways
 *   (work on the legacy stream waits for theirs, theirs for the legacy
 *   stream's), as on a GPU.
 * - Flags are checked: cuStreamCreate (0 or NON_BLOCKING), cuEventCreate
 *   (DEFAULT, BLOCKING_SYNC, DISABLE_TIMING, INTERPROCESS only with
 *   DISABLE_TIMING; cuEventElapsedTime of an untimed event:
 *   CUDA_ERROR_INVALID_HANDLE), cuMemHostAlloc and cuMemHostRegister (their
 *   documented bits only): anything else is CUDA_ERROR_INVALID_VALUE.
 * - cuMemHostRegister of memory that overlaps page-locked memory already
 *   known returns CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (712); of memory
 *   that is not mapped readable, or not writable without
 *   CU_MEMHOSTREGISTER_READ_ONLY, CUDA_ERROR_INVALID_VALUE;
 *   FAKE_LIBCUDA_REGISTER_MAX (bytes) refuses larger single registrations
 *   (CUDA_ERROR_INVALID_VALUE, a per-call limit) and FAKE_LIBCUDA_LOCKED_MAX
 *   more registered bytes in all (CUDA_ERROR_OUT_OF_MEMORY, as a locked-memory
 *   limit does). A registration touches every page, as pinning does.
 * - Copies and memsets whose device range is not inside one allocation are
 *   refused at the call (CUDA_ERROR_INVALID_VALUE), as the driver checks
 *   them. A kernel that touches an address outside every allocation is an
 *   illegal address (700) when it runs: the error becomes sticky (every
 *   later call returns it, later work and host functions are skipped) until
 *   the primary context resets.
 * - cuEventElapsedTime on an event never recorded: CUDA_ERROR_INVALID_HANDLE.
 * - The primary context resets when its reference count reaches 0: every
 *   stream, event and allocation of it is gone (what the back end left is
 *   counted as "leaked_at_reset" and reported on stderr).
 * - Every second cuMemHostAlloc block is 64 bytes past a page boundary (all
 *   of them with FAKE_LIBCUDA_MISALIGN_HOST=1), as the driver does not
 *   promise page alignment.
 * - cuGetErrorName is not exported (the back end names errors itself).
 * - Modules: cuModuleLoadData(Ex) JIT-compiles only PTX it can read: a
 *   `.version` the profile's JIT knows (13.0: up to 9.0, 12.8: 8.7, 12.2: 8.2;
 *   FAKE_LIBCUDA_PTX_ISA_MAX="6.2" lowers it) and a `.target` of at most the
 *   device's sm_75, with one of the kernels it emulates; else
 *   CUDA_ERROR_INVALID_PTX (218) or CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222),
 *   with ptxas' words in the error log buffer (CU_JIT_ERROR_LOG_BUFFER).
 *   Modules load lazily, as with CUDA_MODULE_LOADING=LAZY (the default since
 *   CUDA 12.2): cuModuleLoadData, and the first launch of a function that
 *   cuFuncLoad did not load, wait for every stream (the driver may
 *   synchronize the context to load), aborting as allocations do when a
 *   stream never finishes. "lazy_loads" counts first launches that loaded.
 * - Launches are checked against the device's limits: grid x < 2^31, y and
 *   z <= 65535, block x and y <= 1024, z <= 64, 1024 threads, 48 KiB of
 *   dynamic shared memory (CUDA_ERROR_INVALID_VALUE).
 * - Stream capture (CUDA graphs): cuStreamBeginCapture_v2, cuStreamEndCapture,
 *   cuStreamIsCapturing, cuStreamGetCaptureInfo (and _v2, _v3),
 *   cuThreadExchangeStreamCaptureMode, cuGraphInstantiateWithFlags,
 *   cuGraphLaunch, cuGraphDestroy, cuGraphExecDestroy. Work queued on a
 *   capturing stream becomes the graph's nodes, run in order at each launch;
 *   events recorded there mark points of the capture, and a stream that waits
 *   for one joins it (and must be joined back before the end:
 *   CUDA_ERROR_STREAM_CAPTURE_UNJOINED). What a capture forbids fails and
 *   invalidates it, as on a GPU: synchronizing or destroying a capturing
 *   stream, querying or synchronizing an event of an active capture, a
 *   batch copy, a prefetch or an async copy of pageable memory there
 *   (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900); waiting for an event from
 *   outside the capture (..._ISOLATION, 905); using the legacy stream while
 *   a stream that synchronizes with it captures (..._IMPLICIT, 906; the
 *   query cuStreamIsCapturing of the legacy stream answers 906 and
 *   invalidates nothing). A potentially unsafe call (an allocation, free or
 *   registration, a synchronize, an event query, a module load, a blocking
 *   copy) made while the calling thread captures, or while another thread
 *   captures in CU_STREAM_CAPTURE_MODE_GLOBAL and this thread's mode is not
 *   RELAXED, fails with 900 and invalidates that capture.
 * - Graph-replayable copies: user objects (cuUserObjectCreate, only with
 *   CU_USER_OBJECT_NO_DESTRUCTOR_SYNC; cuUserObjectRelease;
 *   cuGraphRetainUserObject, also on the graph of a capture in progress):
 *   the destructor runs on the host-function thread (driver calls fail
 *   there) once the graph, its executables and their launches are gone.
 *   cuMemHostGetDevicePointer_v2 (flags 0, page-locked memory only) gives
 *   the device's address of page-locked memory: the host address for
 *   cuMemHostAlloc blocks, another one for registered memory (kernel_reach).
 *   The library's mapping_copy_table kernel reads its count and ranges when
 *   it runs; a kernel reaching anything but device memory and mapped
 *   page-locked memory by its device address is an illegal address.
 *   Counters "table_copies", "table_copies_empty", "user_objects_destroyed".
 * - Pointers: cuPointerGetAttribute (context, memory type, device ordinal,
 *   managed, range start and size) and cuMemHostGetFlags know device
 *   allocations and page-locked memory (allocated or registered); anything
 *   else is CUDA_ERROR_INVALID_VALUE.
 * - Devices and contexts: FAKE_LIBCUDA_DEVICES=2 gives a second device with
 *   its own primary context (its own legacy stream, allocations and sticky
 *   error); the host-function thread is shared.
 * - File descriptors, as a real driver holds them: FAKE_LIBCUDA_FDS (default
 *   80) descriptors held from cuInit, and each allocation or registration
 *   needs one more for a moment (CUDA_ERROR_OPERATING_SYSTEM, 304, when the
 *   process may open no more).
 * FAKE_LIBCUDA_STRICT=0 turns off the waiting of allocations and frees, the
 * single host-function thread and the misaligned blocks.
 *
 * Driver profiles (compile-time, since a driver's exports are what the back
 * end looks up): FAKE_CUDA_VERSION=13000 (the default) exports the CUDA 13
 * names (cuMemcpyBatchAsync_v2, cuMemPrefetchAsync_v2, cuEventElapsedTime_v2)
 * beside the older ones a CUDA 13 driver keeps; 12080 exports only the
 * CUDA 12.8 ones (the 9-argument cuMemcpyBatchAsync with failIdx, the CUDA 8
 * cuMemPrefetchAsync, cuEventElapsedTime); 12020 is a CUDA 12.2 driver: no
 * batch copy and no cuFuncLoad (12.4), so a kernel loads at its first launch.
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
 * "largest_host_register", "largest_pinned_async_copy" (the largest
 * cuMemcpy*Async of page-locked memory), "copy_entries_largest_piece" and
 * "copy_entries_threads_per_entry" (the scatter kernel's shape).
 * For tests: fake_cuda_count("cuMemHostAlloc") returns how often a call ran
 * ("forbidden": allocations refused, "leaked_at_reset";
 * "cuStreamSynchronize_legacy": those of them on the CU_STREAM_LEGACY handle;
 * "cuMemcpyHtoD" and the like: the _v2 copies by their plain name;
 * "captures_invalidated", "graph_launches"), and fake_cuda_forbid_alloc(1)
 * makes every allocation and free fail with CUDA_ERROR_NOT_PERMITTED (and
 * count as "forbidden") until fake_cuda_forbid_alloc(0).
 * fake_cuda_hold_legacy(1) stops the legacy stream from starting its next op
 * until fake_cuda_hold_legacy(0) (work a user queued on the device's native
 * queue, not yet done). FAKE_LIBCUDA_COUNTS=1 prints every count at exit.
 * Streams are worker threads; device memory is malloc. It proves nothing
 * about real GPUs: tests/gpu/run.sh does that.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

#ifndef FAKE_CUDA_VERSION
#define FAKE_CUDA_VERSION 13000
#endif

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void (*host_fn)(void *);
enum {
    OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101, NO_BINARY_FOR_GPU = 209,
    INVALID_PTX = 218, UNSUPPORTED_PTX_VERSION = 222, OPERATING_SYSTEM = 304, INVALID_CONTEXT = 201,
    INVALID_HANDLE = 400, ILLEGAL_STATE = 401, NOT_FOUND = 500, NOT_READY = 600, ILLEGAL_ADDRESS = 700,
    HOST_MEMORY_ALREADY_REGISTERED = 712, HOST_MEMORY_NOT_REGISTERED = 713, NOT_PERMITTED = 800,
    CAPTURE_UNSUPPORTED = 900, CAPTURE_INVALIDATED = 901, CAPTURE_UNMATCHED = 903, CAPTURE_UNJOINED = 904,
    CAPTURE_ISOLATION = 905, CAPTURE_IMPLICIT = 906, CAPTURE_WRONG_THREAD = 908,
};
enum { MODE_GLOBAL = 0, MODE_THREAD_LOCAL = 1, MODE_RELAXED = 2 };
enum { CAPTURE_NONE = 0, CAPTURE_ACTIVE = 1, CAPTURE_DEAD = 2 };
enum { MAX_DEVICES = 2, DEVICE_SM = 75 };

static bool initialized;
static bool strict = true;
static bool sync_alloc; /* allocations wait for every stream too (strict) */
static double deadlock_seconds = 8;
static int device_count = 1;
static size_t register_max, locked_max, locked_now; /* 0: no limit; locked_now under registry_lock */
static _Thread_local bool in_host_fn;
static int sticky[MAX_DEVICES]; /* each context's sticky error, 0 when none */
static bool function_loaded, saxpy_loaded, jacobi_loaded, diff_loaded, table_loaded; /* kernels loaded by cuFuncLoad or a first launch */
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
    X(largest_pinned_async_copy) X(cuEventCreate) X(cuEventDestroy) X(cuEventQuery) X(cuStreamIsCapturing)   \
    X(cuStreamGetCaptureInfo) X(cuPointerGetAttribute) X(cuThreadExchangeStreamCaptureMode)                 \
    X(captures_invalidated) X(graph_launches) X(largest_host_register) X(cuStreamDestroy)                  \
    X(cuMemcpyDtoDAsync) X(cuMemsetD8Async) X(cuStreamWaitEvent) X(cuEventRecord)                      \
    X(cuMemHostGetDevicePointer) X(cuUserObjectCreate) X(user_objects_destroyed) X(table_copies)            \
    X(table_copies_empty)
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
    static const int gauges[] = {COUNT_copy_entries_largest_piece, COUNT_copy_entries_threads_per_entry,
                                 COUNT_largest_host_alloc, COUNT_largest_pinned_async_copy,
                                 COUNT_largest_host_register};
    for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++)
        __atomic_store_n(&counters[gauges[i]], 0, __ATOMIC_RELAXED);
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

static size_t size_from_env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? (size_t)strtoull(v, NULL, 10) : 0;
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
    const char *n = getenv("FAKE_LIBCUDA_DEVICES");
    device_count = n && atoi(n) >= 2 ? 2 : 1;
    register_max = size_from_env("FAKE_LIBCUDA_REGISTER_MAX");
    locked_max = size_from_env("FAKE_LIBCUDA_LOCKED_MAX");
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

/* ---- file descriptors, held as a driver holds its device files ---- */
static int held_fd = -1;

static void hold_descriptors(void)
{
    const char *v = getenv("FAKE_LIBCUDA_FDS");
    int n = v && *v ? atoi(v) : 80;
    held_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    for (int i = 1; i < n && held_fd >= 0; i++)
        if (fcntl(held_fd, F_DUPFD_CLOEXEC, 0) < 0)
            break; /* held until exit, like the driver's */
}

/* An allocation's moment with one more descriptor. */
static bool descriptor_available(void)
{
    if (held_fd < 0)
        return true;
    int fd = fcntl(held_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

/* ---- contexts: a primary context per device, a stack per thread ---- */
static int primary_refs[MAX_DEVICES];
static int primary_token[MAX_DEVICES]; /* the CUcontext of device i is &primary_token[i] */
static _Thread_local void *ctx_stack[16];
static _Thread_local int ctx_depth;

static int ctx_index(const void *ctx)
{
    for (int i = 0; i < device_count; i++)
        if (ctx == &primary_token[i])
            return i;
    return -1;
}

/* The calling thread's current context, -1 when none. */
static int current_ctx(void)
{
    return ctx_depth ? ctx_index(ctx_stack[ctx_depth - 1]) : -1;
}

#define NEED_CONTEXT()                                                                          \
    do {                                                                                        \
        if (in_host_fn)                                                                         \
            return NOT_PERMITTED;                                                               \
        if (!initialized)                                                                       \
            return NOT_INITIALIZED;                                                             \
        int c_ = current_ctx();                                                                 \
        if (c_ < 0 || __atomic_load_n(&primary_refs[c_], __ATOMIC_SEQ_CST) <= 0)                \
            return INVALID_CONTEXT;                                                             \
        int sticky_ = __atomic_load_n(&sticky[c_], __ATOMIC_SEQ_CST);                           \
        if (sticky_)                                                                            \
            return sticky_;                                                                     \
    } while (0)

/* Everything the contexts own, under one lock. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- device allocations: for the range checks and pointer attributes ---- */
typedef struct range {
    uintptr_t start, end;
    int       ctx;
    bool      managed;
} range;
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

static bool dev_add(void *p, size_t n, bool managed)
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
        dev_allocs[i] = (range){a, a + (n ? n : 1), current_ctx(), managed};
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

/* The allocation holding [p, p + n), copied into *out; false when none. */
static bool dev_lookup(const void *p, size_t n, range *out)
{
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&registry_lock);
    size_t i = dev_find(a);
    bool ok = i < dev_count && dev_allocs[i].start <= a && a + n <= dev_allocs[i].end && a + n >= a;
    if (ok && out)
        *out = dev_allocs[i];
    pthread_mutex_unlock(&registry_lock);
    return ok;
}

/* Is [p, p + n) inside one device allocation? */
static bool dev_valid(const void *p, size_t n)
{
    return dev_lookup(p, n, NULL);
}

/* ---- page-locked host memory: what the driver page-locked ---- */
typedef struct pinned {
    uintptr_t start;
    size_t    bytes;
    bool      allocated;
    void     *base;
    unsigned  flags;
    int       ctx;
} pinned;
static pinned pins[4096];
static int pin_count;

/* The page-locked block holding [p, p + n), copied into *out; false when none. */
static bool pin_lookup(const void *p, size_t n, pinned *out)
{
    uintptr_t a = (uintptr_t)p;
    bool found = false;
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < pin_count && !found; i++)
        if (a >= pins[i].start && a + n <= pins[i].start + pins[i].bytes) {
            found = true;
            if (out)
                *out = pins[i];
        }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

static bool is_pinned(const void *p, size_t n)
{
    return pin_lookup(p, n, NULL);
}

/* Mapped page-locked memory (unified addressing): cuMemHostGetDevicePointer
 * gives the device's address of page-locked host memory, the host address
 * itself for memory cuMemHostAlloc made, another one for registered memory
 * (as where CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM is
 * 0): a back end that hands a kernel the host address of registered memory
 * makes an illegal address here. */
#define MAPPED_ALIAS ((uintptr_t)1 << 62)

/* What a kernel reaches at device address a, n bytes: device memory, or
 * mapped page-locked host memory by its device address; NULL: an illegal
 * address (pageable memory, freed or unregistered memory). */
static void *kernel_reach(uintptr_t a, size_t n)
{
    pinned b;
    if (a + n < a)
        return NULL;
    if (dev_valid((void *)a, n))
        return (void *)a;
    if (a >= MAPPED_ALIAS)
        return pin_lookup((void *)(a - MAPPED_ALIAS), n, &b) && !b.allocated ? (void *)(a - MAPPED_ALIAS) : NULL;
    return pin_lookup((void *)a, n, &b) && b.allocated ? (void *)a : NULL;
}

static CUresult pin_add(void *p, size_t n, bool allocated, void *base, unsigned flags)
{
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&registry_lock);
    CUresult r = pin_count < 4096 ? OK : OUT_OF_MEMORY;
    for (int i = 0; i < pin_count && r == OK; i++)
        if (a < pins[i].start + pins[i].bytes && pins[i].start < a + n)
            r = HOST_MEMORY_ALREADY_REGISTERED; /* overlapping or the same */
    if (r == OK && !allocated && locked_max && locked_now + n > locked_max)
        r = OUT_OF_MEMORY; /* beyond the locked-memory limit */
    if (r == OK) {
        pins[pin_count++] = (pinned){a, n, allocated, base, flags, current_ctx()};
        if (!allocated)
            locked_now += n;
    }
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
            if (!allocated)
                locked_now -= pins[i].bytes;
            pins[i] = pins[--pin_count];
            r = OK;
            break;
        }
    pthread_mutex_unlock(&registry_lock);
    return r;
}

/* ---- events: each record is a mark, which completes when its stream gets
 * there; an event is its latest mark. A wait holds the mark it saw (as in
 * CUDA, a later record of the same event does not change what an earlier
 * wait waits for). ---- */
typedef struct mark {
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    bool            done;
    double          ms;
    int             refs; /* the event (while latest) and each queued record or wait */
} mark;

typedef struct event {
    pthread_mutex_t lock;
    unsigned        flags;
    bool            recorded;
    mark           *latest; /* NULL: never recorded (complete) */
    /* Recorded on a capturing stream (under capture_lock): the capture's
     * id (0: recorded outside any capture), the stream and its count of
     * nodes then. */
    unsigned long long cap_id, cap_seq;
    struct stream     *cap_stream;
} event;

static mark *mark_new(void)
{
    mark *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->cond, NULL);
    m->refs = 1;
    return m;
}

static void mark_retain(mark *m)
{
    pthread_mutex_lock(&m->lock);
    m->refs++;
    pthread_mutex_unlock(&m->lock);
}

static void mark_release(mark *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->lock);
    int left = --m->refs;
    pthread_mutex_unlock(&m->lock);
    if (left == 0) {
        pthread_mutex_destroy(&m->lock);
        pthread_cond_destroy(&m->cond);
        free(m);
    }
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void mark_complete(mark *m)
{
    pthread_mutex_lock(&m->lock);
    m->done = true;
    m->ms = now_ms();
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->lock);
}

static void mark_wait(mark *m)
{
    pthread_mutex_lock(&m->lock);
    while (!m->done)
        pthread_cond_wait(&m->cond, &m->lock);
    pthread_mutex_unlock(&m->lock);
}

static bool mark_done(mark *m, double *ms)
{
    if (!m)
        return true;
    pthread_mutex_lock(&m->lock);
    bool done = m->done;
    if (ms)
        *ms = m->ms;
    pthread_mutex_unlock(&m->lock);
    return done;
}

/* The event's latest mark, retained (NULL: never recorded). */
static mark *event_latest(event *e)
{
    pthread_mutex_lock(&e->lock);
    mark *m = e->latest;
    if (m)
        mark_retain(m);
    pthread_mutex_unlock(&e->lock);
    return m;
}

static event *event_new(unsigned flags)
{
    event *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    pthread_mutex_init(&e->lock, NULL);
    e->flags = flags;
    return e;
}

static void event_free(event *e)
{
    mark_release(e->latest);
    pthread_mutex_destroy(&e->lock);
    free(e);
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

/* ---- streams: a worker thread each, the legacy streams too ---- */
typedef enum {
    OP_COPY, OP_SET, OP_HOST_FN, OP_RECORD, OP_WAIT, OP_KERNEL, OP_SAXPY, OP_JACOBI, OP_DIFF, OP_FAULT, OP_GRAPH_END,
    OP_TABLE
} op_kind;
typedef struct op {
    struct op  *next;
    op_kind     kind;
    int         ctx; /* the context whose stream runs it (its sticky error) */
    void       *dst;
    const void *src;
    size_t      bytes;
    int         value;
    host_fn     fn;
    void       *user;
    mark       *ev;
    void       *owned; /* freed after the op ran (a pageable source copied at submit) */
    size_t      split;  /* OP_KERNEL: bytes per piece (0: the old kernel, a block per whole entry) */
    unsigned    pieces; /* OP_KERNEL: gridDim.y, pieces per entry at most */
} op;

struct capture;
typedef struct stream {
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    op             *head, *tail;
    bool            busy, quit;
    pthread_t       thread;
    struct stream  *next_live;
    int             visitors; /* under registry_lock: threads waiting for it in synchronize_all_streams */
    int             ctx;
    unsigned        flags;     /* CU_STREAM_NON_BLOCKING or 0 (synchronizes with the legacy stream) */
    bool            is_legacy;
    /* Under capture_lock: the capture it takes part in, whether it added
     * nodes since it was last joined back (a stream that joined by waiting
     * for an event), and how many nodes it added. */
    struct capture    *cap;
    bool               unjoined;
    unsigned long long appended;
} stream;

static stream *live_streams; /* under registry_lock; the legacy streams included */
static int legacy_held;      /* fake_cuda_hold_legacy */
static pthread_cond_t visitors_gone = PTHREAD_COND_INITIALIZER;
static stream *legacy_of[MAX_DEVICES]; /* created with each context */

/* The special handles (cuda.h: CU_STREAM_LEGACY, CU_STREAM_PER_THREAD). */
#define LEGACY_HANDLE ((stream *)(uintptr_t)0x1)
#define PER_THREAD_HANDLE ((stream *)(uintptr_t)0x2)
static bool stream_live(stream *s);

static stream *legacy_here(void)
{
    int c = current_ctx();
    return legacy_of[c < 0 ? 0 : c];
}

/* A CUstream argument: 0 and the special handles are the legacy stream;
 * anything else must be a live stream. */
#define STREAM_ARG(s)                                                        \
    do {                                                                     \
        if (!(s) || (s) == LEGACY_HANDLE || (s) == PER_THREAD_HANDLE)        \
            (s) = legacy_here();                                             \
        else if (!stream_live(s))                                            \
            return INVALID_HANDLE;                                           \
    } while (0)

typedef struct { unsigned long long staging_offset, buffer_offset, bytes; } entry;

static void set_sticky(int ctx, int code)
{
    int none = 0;
    __atomic_compare_exchange_n(&sticky[ctx < 0 ? 0 : ctx], &none, code, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

/* The back end's mapping_copy_entries kernel: dst = buffer, src = staging,
 * user = the table (read when the kernel runs, as on a GPU), bytes = count,
 * value = gather. With split (the kernel that cuts entries into pieces):
 * piece y of each entry is [y * split, +split), for y < pieces, as the
 * kernel's blockIdx.y does: bytes beyond pieces * split are never copied.
 * The gauges record how much of one entry one warp (or, for the old kernel,
 * one 256-thread block) copies, and the threads given to an entry. A launch
 * over no entries reads nothing. */
static void copy_entry(op *o, unsigned char *at_staging, unsigned char *at_buffer, size_t bytes)
{
    if (!o->split) { /* the old kernel: the whole entry by one block */
        gauge_max(COUNT_copy_entries_largest_piece, (long long)bytes);
        memmove(o->value ? at_staging : at_buffer, o->value ? at_buffer : at_staging, bytes);
        return;
    }
    for (unsigned y = 0; y < o->pieces; y++) {
        size_t lo = (size_t)y * o->split;
        if (lo >= bytes)
            break;
        size_t n = bytes - lo < o->split ? bytes - lo : o->split;
        gauge_max(COUNT_copy_entries_largest_piece, (long long)n);
        memmove(o->value ? at_staging + lo : at_buffer + lo, o->value ? at_buffer + lo : at_staging + lo, n);
    }
}

static void run_copy_entries(op *o)
{
    const entry *table = o->user;
    if (o->bytes && !dev_valid(table, o->bytes * sizeof *table)) {
        set_sticky(o->ctx, ILLEGAL_ADDRESS);
        return;
    }
    for (size_t i = 0; i < o->bytes; i++) {
        unsigned char *at_staging = (unsigned char *)o->src + table[i].staging_offset;
        unsigned char *at_buffer = (unsigned char *)o->dst + table[i].buffer_offset;
        if (!dev_valid(at_staging, table[i].bytes) || !dev_valid(at_buffer, table[i].bytes)) {
            set_sticky(o->ctx, ILLEGAL_ADDRESS);
            return;
        }
        copy_entry(o, at_staging, at_buffer, table[i].bytes);
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

/* The back end's mapping_diff_blocks: src = mem, dst = shadow, user = flags, bytes = blocks. */
static void run_diff(op *o)
{
    for (size_t b = 0; b < o->bytes; b++) {
        const char *a = (const char *)o->src + b * 4096;
        char *sh = (char *)o->dst + b * 4096;
        int changed = memcmp(a, sh, 4096) != 0;
        if (changed)
            memcpy(sh, a, 4096);
        ((unsigned char *)o->user)[b] = (unsigned char)changed;
    }
}

/* ---- graphs: the nodes a capture recorded, shared by the graph and its
 * executables, and by each launch until its last node ran ---- */
typedef struct user_object {
    host_fn destroy;
    void   *ptr;
    int     refs;
} user_object;

typedef struct held_object {
    user_object *obj;
    unsigned     count;
} held_object;

typedef struct graph_body {
    op          *nodes;
    size_t       count, cap;
    int          refs;
    held_object *held; /* user objects the graph holds references to (cuGraphRetainUserObject) */
    size_t       n_held, cap_held;
} graph_body;

static void run_host_fn(host_fn fn, void *user);

/* The last reference gone: its destructor runs on the driver's thread of host
 * functions, where driver calls fail (CUDA forbids them in destructors). */
static void user_object_release(user_object *o, unsigned n)
{
    if (__atomic_sub_fetch(&o->refs, (int)n, __ATOMIC_ACQ_REL) != 0)
        return;
    count(COUNT_user_objects_destroyed);
    run_host_fn(o->destroy, o->ptr);
    free(o);
}

static void body_release(graph_body *g)
{
    if (__atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    for (size_t i = 0; i < g->count; i++)
        free(g->nodes[i].owned);
    for (size_t i = 0; i < g->n_held; i++)
        user_object_release(g->held[i].obj, g->held[i].count);
    free(g->held);
    free(g->nodes);
    free(g);
}

/* The back end's mapping_copy_table: user = the table's device address
 * (mapped page-locked memory), src = the host side's device address, dst =
 * the device side, value = to_host, bytes = the capacity. The count and the
 * entries are read when it runs, as on a GPU. */
static void run_copy_table(op *o)
{
    const unsigned long long *table = kernel_reach((uintptr_t)o->user, 16);
    if (!table) {
        set_sticky(o->ctx, ILLEGAL_ADDRESS);
        return;
    }
    unsigned long long n = __atomic_load_n(&table[0], __ATOMIC_ACQUIRE);
    n = n < o->bytes ? n : o->bytes;
    count(COUNT_table_copies);
    if (!n)
        count(COUNT_table_copies_empty);
    const unsigned long long *e = n ? kernel_reach((uintptr_t)o->user + 16, n * 16) : NULL;
    if (n && !e) {
        set_sticky(o->ctx, ILLEGAL_ADDRESS);
        return;
    }
    for (unsigned long long i = 0; i < n; i++) {
        unsigned char *h = kernel_reach((uintptr_t)o->src + e[2 * i], e[2 * i + 1]);
        unsigned char *d = kernel_reach((uintptr_t)o->dst + e[2 * i], e[2 * i + 1]);
        if (!h || !d) {
            set_sticky(o->ctx, ILLEGAL_ADDRESS);
            return;
        }
        memmove(o->value ? h : d, o->value ? d : h, e[2 * i + 1]);
    }
}

static void run_op(op *o)
{
    bool skip = __atomic_load_n(&sticky[o->ctx], __ATOMIC_SEQ_CST) != 0; /* the context is broken: nothing runs */
    switch (o->kind) {
    case OP_COPY: if (!skip && o->bytes) memmove(o->dst, o->src, o->bytes); break;
    case OP_SET: if (!skip && o->bytes) memset(o->dst, o->value, o->bytes); break;
    case OP_HOST_FN: if (!skip) run_host_fn(o->fn, o->user); break;
    case OP_RECORD: mark_complete(o->ev); mark_release(o->ev); break;
    case OP_WAIT: mark_wait(o->ev); mark_release(o->ev); break;
    case OP_KERNEL: if (!skip) run_copy_entries(o); break;
    case OP_SAXPY: /* examples/kernels/scale.cu: y = a*x + y; value = a, src = x, dst = y, bytes = n */
        for (size_t i = 0; i < o->bytes && !skip; i++)
            ((float *)o->dst)[i] = (float)o->value * ((const float *)o->src)[i] + ((float *)o->dst)[i];
        break;
    case OP_JACOBI: if (!skip) run_jacobi(o); break;
    case OP_DIFF: if (!skip) run_diff(o); break;
    case OP_FAULT: set_sticky(o->ctx, ILLEGAL_ADDRESS); break;
    case OP_GRAPH_END: body_release(o->user); break;
    case OP_TABLE: if (!skip) run_copy_table(o); break;
    }
    free(o->owned);
}

static void *worker(void *arg)
{
    stream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while ((!s->head || (s->is_legacy && __atomic_load_n(&legacy_held, __ATOMIC_SEQ_CST))) && !s->quit)
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
    for (int i = 0; !on && i < MAX_DEVICES; i++) {
        stream *l = legacy_of[i];
        if (!l)
            continue;
        pthread_mutex_lock(&l->lock);
        pthread_cond_broadcast(&l->cond);
        pthread_mutex_unlock(&l->lock);
    }
}

static stream *stream_new(int ctx, unsigned flags, bool is_legacy)
{
    stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->ctx = ctx;
    s->flags = flags;
    s->is_legacy = is_legacy;
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

/* Appends to the stream's queue, capture or not; the stream's lock is not held. */
static CUresult enqueue(stream *s, op o)
{
    op *p = malloc(sizeof *p);
    if (!p) {
        free(o.owned);
        return OUT_OF_MEMORY;
    }
    *p = o;
    p->next = NULL;
    p->ctx = s->ctx;
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

/* ---- stream capture: the captures in progress, under capture_lock ---- */
typedef struct capture {
    unsigned long long id;
    int                status; /* CAPTURE_ACTIVE or CAPTURE_DEAD (invalidated) */
    int                mode;   /* MODE_* given to cuStreamBeginCapture_v2 */
    pthread_t          thread; /* that began it */
    stream            *origin;
    graph_body        *g;
} capture;
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static capture *captures[64];
static int capture_count;
static unsigned long long capture_ids;
static _Thread_local int thread_mode = MODE_GLOBAL; /* cuThreadExchangeStreamCaptureMode */

static void invalidate(capture *c)
{
    if (c->status == CAPTURE_ACTIVE)
        count(COUNT_captures_invalidated);
    c->status = CAPTURE_DEAD;
}

static capture *capture_find(unsigned long long id) /* capture_lock held */
{
    for (int i = 0; i < capture_count; i++)
        if (captures[i]->id == id)
            return captures[i];
    return NULL;
}

/* An active capture of a stream of ctx that synchronizes with the legacy
 * stream (created without NON_BLOCKING), or NULL. capture_lock held. */
static capture *blocking_capture(int ctx)
{
    capture *found = NULL;
    pthread_mutex_lock(&registry_lock);
    for (stream *s = live_streams; s && !found; s = s->next_live)
        if (!s->is_legacy && !(s->flags & 1) && s->ctx == ctx && s->cap && s->cap->status == CAPTURE_ACTIVE)
            found = s->cap;
    pthread_mutex_unlock(&registry_lock);
    return found;
}

/* Work on ctx's legacy stream now: invalid while a blocking stream captures
 * (it would depend on the capture), and that capture is invalidated. */
static CUresult legacy_use(int ctx)
{
    pthread_mutex_lock(&capture_lock);
    capture *c = blocking_capture(ctx);
    if (c)
        invalidate(c);
    pthread_mutex_unlock(&capture_lock);
    return c ? CAPTURE_IMPLICIT : OK;
}

/* A potentially unsafe call (it may synchronize or allocate): prohibited
 * while this thread captures (unless that capture is RELAXED) or, for a
 * thread in GLOBAL mode, while another thread captures in GLOBAL mode; such
 * a capture is invalidated. A thread in RELAXED mode may make any call. */
static CUresult unsafe_call(void)
{
    if (thread_mode == MODE_RELAXED)
        return OK;
    CUresult r = OK;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&capture_lock);
    for (int i = 0; i < capture_count; i++) {
        capture *c = captures[i];
        bool mine = pthread_equal(c->thread, self);
        if (c->status == CAPTURE_ACTIVE &&
            ((mine && c->mode != MODE_RELAXED) || (!mine && c->mode == MODE_GLOBAL && thread_mode == MODE_GLOBAL))) {
            invalidate(c);
            r = CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&capture_lock);
    return r;
}

#define UNSAFE_CALL()                         \
    do {                                      \
        CUresult unsafe_ = unsafe_call();     \
        if (unsafe_ != OK)                    \
            return unsafe_;                   \
    } while (0)

/* Adds a node to the stream's capture; capture_lock held. */
static CUresult capture_add(stream *s, const op *o)
{
    capture *c = s->cap;
    if (c->status != CAPTURE_ACTIVE)
        return CAPTURE_INVALIDATED;
    graph_body *g = c->g;
    if (g->count == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        op *n = realloc(g->nodes, cap * sizeof *n);
        if (!n)
            return OUT_OF_MEMORY;
        g->nodes = n;
        g->cap = cap;
    }
    g->nodes[g->count] = *o;
    g->nodes[g->count].next = NULL;
    g->nodes[g->count].ctx = s->ctx;
    g->count++;
    s->appended++;
    if (s != c->origin)
        s->unjoined = true;
    return OK;
}

/* What a capturing stream cannot do: the capture is invalidated. */
static CUresult capture_refuses(stream *s)
{
    pthread_mutex_lock(&capture_lock);
    capture *c = s->cap;
    if (c)
        invalidate(c);
    pthread_mutex_unlock(&capture_lock);
    return c ? CAPTURE_UNSUPPORTED : OK;
}

static bool capturing(stream *s)
{
    pthread_mutex_lock(&capture_lock);
    bool on = s->cap != NULL;
    pthread_mutex_unlock(&capture_lock);
    return on;
}

/* A stream that synchronizes with the legacy stream waits for `other`'s
 * work so far: an event recorded at the end of other, waited for here. */
static void wait_for_tail(stream *s, stream *other)
{
    pthread_mutex_lock(&other->lock);
    bool idle = !other->head && !other->busy;
    pthread_mutex_unlock(&other->lock);
    mark *m = idle ? NULL : mark_new();
    if (!m)
        return;
    mark_retain(m);
    enqueue(other, (op){.kind = OP_RECORD, .ev = m}); /* the first reference */
    enqueue(s, (op){.kind = OP_WAIT, .ev = m});
}

/* Legacy-stream implicit synchronization: work queued on the legacy stream
 * waits for the blocking streams of its context, and theirs for it. */
static void implicit_sync(stream *s)
{
    if (!s->is_legacy && (s->flags & 1))
        return;
    pthread_mutex_lock(&registry_lock);
    for (stream *o = live_streams; o; o = o->next_live) {
        bool blocking = !o->is_legacy && !(o->flags & 1);
        if (o != s && o->ctx == s->ctx && (s->is_legacy ? blocking : o->is_legacy) && !o->cap)
            wait_for_tail(s, o);
    }
    pthread_mutex_unlock(&registry_lock);
}

static CUresult submit(stream *s, op o)
{
    if (!s)
        s = legacy_here();
    pthread_mutex_lock(&capture_lock);
    if (s->cap) {
        CUresult r = capture_add(s, &o);
        pthread_mutex_unlock(&capture_lock);
        if (r != OK)
            free(o.owned);
        return r;
    }
    pthread_mutex_unlock(&capture_lock);
    CUresult r = s->is_legacy ? legacy_use(s->ctx) : OK;
    if (r != OK) {
        free(o.owned);
        return r;
    }
    implicit_sync(s);
    return enqueue(s, o);
}

/* Waits until the stream is idle; false when that took longer than `limit`
 * seconds (limit <= 0: no limit). */
static bool drain_within(stream *s, double limit)
{
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
    drain_within(s ? s : legacy_here(), 0);
}

/* Waits for the streams that `all` (every stream) or, else, ctx's legacy
 * stream and the streams synchronizing with it. A wait that does not end
 * within `limit` seconds (> 0) is a hang on a GPU: abort, naming `call`. */
static void drain_streams(const char *call, bool all, int ctx, double limit)
{
    pthread_mutex_lock(&registry_lock);
    size_t n = 0;
    for (stream *s = live_streams; s; s = s->next_live)
        n++;
    stream **list = malloc((n ? n : 1) * sizeof *list);
    n = 0;
    for (stream *s = live_streams; s && list; s = s->next_live)
        if (all || (s->ctx == ctx && (s->is_legacy || !(s->flags & 1)))) {
            s->visitors++; /* kept alive until we are done with it */
            list[n++] = s;
        }
    pthread_mutex_unlock(&registry_lock);
    for (size_t i = 0; i < n; i++) {
        if (!drain_within(list[i], limit)) {
            fprintf(stderr,
                    "fake libcuda: %s waited %.0f s for a stream that does not finish (a host function waiting for "
                    "the caller?): a real driver, which synchronizes allocations and frees with every stream, "
                    "hangs here\n",
                    call, limit);
            abort();
        }
    }
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < n; i++)
        list[i]->visitors--;
    pthread_cond_broadcast(&visitors_gone);
    pthread_mutex_unlock(&registry_lock);
    free(list);
}

/* What a real driver does in a free, and may do in an allocation: wait for
 * all work of the context. A wait that does not end is a hang on a GPU: abort. */
static void synchronize_all_streams(const char *call)
{
    if (strict)
        drain_streams(call, true, 0, deadlock_seconds);
}

/* The legacy stream as a blocking call sees it: its own work and that of
 * the streams that synchronize with it. */
static void drain_legacy(void)
{
    int c = current_ctx();
    drain_streams("a blocking call", false, c < 0 ? 0 : c, 0);
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
        UNSAFE_CALL();                                                                       \
        if (!(is_free) && !descriptor_available())                                           \
            return OPERATING_SYSTEM;                                                         \
        if ((is_free) || sync_alloc)                                                         \
            synchronize_all_streams(#name);                                                  \
    } while (0)

/* ---- the primary contexts' lives ---- */

static void context_create(int ctx)
{
    __atomic_store_n(&sticky[ctx], 0, __ATOMIC_SEQ_CST);
    legacy_of[ctx] = stream_new(ctx, 0, true);
}

/* Drops the captures begun on ctx's streams (its streams are ending). */
static void captures_drop(int ctx)
{
    pthread_mutex_lock(&capture_lock);
    pthread_mutex_lock(&registry_lock);
    for (stream *s = live_streams; s; s = s->next_live)
        if (s->ctx == ctx)
            s->cap = NULL;
    pthread_mutex_unlock(&registry_lock);
    for (int i = 0; i < capture_count;) {
        capture *c = captures[i];
        if (c->origin->ctx != ctx) {
            i++;
            continue;
        }
        body_release(c->g);
        free(c);
        captures[i] = captures[--capture_count];
    }
    pthread_mutex_unlock(&capture_lock);
}

/* The next live stream of ctx, or NULL. */
static stream *stream_of(int ctx)
{
    pthread_mutex_lock(&registry_lock);
    stream *s = live_streams;
    while (s && s->ctx != ctx)
        s = s->next_live;
    pthread_mutex_unlock(&registry_lock);
    return s;
}

/* Frees ctx's allocations and page-locked memory; how many there were. */
static long long memory_drop(int ctx)
{
    long long n = 0;
    pthread_mutex_lock(&registry_lock);
    size_t kept = 0;
    for (size_t i = 0; i < dev_count; i++) {
        if (dev_allocs[i].ctx == ctx) {
            free((void *)dev_allocs[i].start);
            n++;
        } else {
            dev_allocs[kept++] = dev_allocs[i];
        }
    }
    dev_count = kept;
    for (int i = 0; i < pin_count;) {
        if (pins[i].ctx != ctx) {
            i++;
            continue;
        }
        n++;
        if (pins[i].allocated)
            free(pins[i].base);
        else
            locked_now -= pins[i].bytes;
        pins[i] = pins[--pin_count];
    }
    pthread_mutex_unlock(&registry_lock);
    return n;
}

/* Refcount 0: everything the context owned goes. */
static void context_reset(int ctx)
{
    count(COUNT_context_resets);
    if (ctx == 0)
        function_loaded = saxpy_loaded = jacobi_loaded = diff_loaded = table_loaded = false; /* the modules are gone */
    captures_drop(ctx);
    long long leaked = 0;
    for (stream *s; (s = stream_of(ctx)) != NULL;) {
        if (!s->is_legacy)
            leaked++;
        drain_within(s, 0);
        stream_end(s);
    }
    legacy_of[ctx] = NULL;
    leaked += memory_drop(ctx);
    if (leaked) {
        __atomic_add_fetch(&counters[COUNT_leaked_at_reset], leaked, __ATOMIC_RELAXED);
        fprintf(stderr, "fake libcuda: the primary context reset with %lld streams, allocations or registrations "
                        "still live (now gone)\n", leaked);
    }
    __atomic_store_n(&sticky[ctx], 0, __ATOMIC_SEQ_CST);
}

/* ---- the API ---- */

API CUresult cuInit(unsigned flags)
{
    (void)flags;
    if (!initialized)
        hold_descriptors();
    initialized = true;
    return OK;
}
API CUresult cuDriverGetVersion(int *v) { *v = FAKE_CUDA_VERSION; return OK; }
API CUresult cuDeviceGetCount(int *n) { if (!initialized) return NOT_INITIALIZED; *n = device_count; return OK; }
API CUresult cuDeviceGet(int *d, int i) { if (i < 0 || i >= device_count) return INVALID_DEVICE; *d = i; return OK; }
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
    case 75: *v = DEVICE_SM / 10; break; /* compute capability 7.5 */
    case 76: *v = DEVICE_SM % 10; break;
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
    if (d < 0 || d >= device_count)
        return INVALID_DEVICE;
    pthread_mutex_lock(&primary_lock);
    if (primary_refs[d] == 0)
        context_create(d);
    __atomic_add_fetch(&primary_refs[d], 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&primary_lock);
    *ctx = &primary_token[d];
    return OK;
}
API CUresult cuDevicePrimaryCtxRelease_v2(int d)
{
    if (d < 0 || d >= device_count)
        return INVALID_DEVICE;
    pthread_mutex_lock(&primary_lock);
    CUresult r = primary_refs[d] > 0 ? OK : INVALID_CONTEXT;
    if (r == OK && __atomic_sub_fetch(&primary_refs[d], 1, __ATOMIC_SEQ_CST) == 0)
        context_reset(d);
    pthread_mutex_unlock(&primary_lock);
    return r;
}
API CUresult cuCtxGetCurrent(void **ctx) { *ctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; return OK; }
API CUresult cuCtxPushCurrent_v2(void *ctx)
{
    if (ctx_index(ctx) < 0 || ctx_depth == 16)
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

static CUresult device_alloc(CUdeviceptr *p, size_t n, bool managed)
{
    void *m = malloc(n ? n : 1);
    if (!m)
        return OUT_OF_MEMORY;
    if (!dev_add(m, n, managed)) {
        free(m);
        return OUT_OF_MEMORY;
    }
    *p = (uintptr_t)m;
    return OK;
}
API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    ALLOCATION(cuMemAlloc, false);
    return device_alloc(p, n, false);
}
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f)
{
    ALLOCATION(cuMemAllocManaged, false);
    if (f != 1 && f != 2) /* CU_MEM_ATTACH_GLOBAL or _HOST */
        return INVALID_VALUE;
    return device_alloc(p, n, true);
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
    ALLOCATION(cuMemHostAlloc, false);
    if (flags & ~7u) /* PORTABLE, DEVICEMAP, WRITECOMBINED */
        return INVALID_VALUE;
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
    CUresult r = pin_add(*p, n, true, base, flags);
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

/* Is every byte of [p, p + n) mapped with these permissions ("r", "rw")?
 * /proc/self/maps, as the kernel's pinning sees the mappings. */
static bool mapped_with(const void *p, size_t n, bool write)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return true; /* cannot tell: as the driver would try */
    uintptr_t at = (uintptr_t)p, end = at + n;
    char line[512];
    while (at < end && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || hi <= at)
            continue;
        if (lo > at || perms[0] != 'r' || (write && perms[1] != 'w'))
            break; /* a hole, or pages the flags do not allow */
        at = hi;
    }
    fclose(f);
    return at >= end;
}

/* Pinning touches every page (get_user_pages): read one byte of each. */
static void touch_pages(const void *p, size_t n)
{
    volatile const unsigned char *c = p;
    for (size_t i = 0; i < n; i += 4096)
        (void)c[i];
}

API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f)
{
    ALLOCATION(cuMemHostRegister, false);
    if (!p || !n || (f & ~0xfu)) /* PORTABLE, DEVICEMAP, IOMEMORY, READ_ONLY */
        return INVALID_VALUE;
    if (register_max && n > register_max)
        return INVALID_VALUE; /* over the per-call limit */
    if (!mapped_with(p, n, !(f & 8)))
        return INVALID_VALUE; /* not mapped, or read-only without CU_MEMHOSTREGISTER_READ_ONLY */
    gauge_max(COUNT_largest_host_register, (long long)n);
    CUresult r = pin_add(p, n, false, NULL, f);
    if (r == OK)
        touch_pages(p, n);
    return r;
}
API CUresult cuMemHostUnregister(void *p)
{
    ALLOCATION(cuMemHostUnregister, true);
    void *base;
    return pin_remove(p, false, &base);
}
API CUresult cuMemHostGetFlags(unsigned *flags, void *p)
{
    NEED_CONTEXT();
    pinned b;
    if (!pin_lookup(p, 1, &b))
        return INVALID_VALUE;
    *flags = b.flags;
    return OK;
}

/* The device's address of page-locked host memory (kernel_reach). */
API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags)
{
    NEED_CONTEXT();
    count(COUNT_cuMemHostGetDevicePointer);
    pinned b;
    if (!d || flags != 0 || !pin_lookup(p, 1, &b))
        return INVALID_VALUE; /* pageable memory, or flags (which must be 0) */
    *d = (uintptr_t)p + (b.allocated ? 0 : MAPPED_ALIAS);
    return OK;
}

/* cuPointerGetAttribute's answers for one pointer. */
static CUresult attribute_of(void *data, int attr, int type, int ctx, uintptr_t start, size_t size, bool managed)
{
    switch (attr) {
    case 1: *(void **)data = &primary_token[ctx]; return OK;      /* CONTEXT */
    case 2: *(unsigned *)data = (unsigned)type; return OK;        /* MEMORY_TYPE: 1 host, 2 device */
    case 8: *(unsigned *)data = managed; return OK;               /* IS_MANAGED */
    case 9: *(int *)data = ctx; return OK;                        /* DEVICE_ORDINAL */
    case 11: *(CUdeviceptr *)data = start; return OK;             /* RANGE_START_ADDR */
    case 12: *(size_t *)data = size; return OK;                   /* RANGE_SIZE */
    default: return INVALID_VALUE;
    }
}
API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    NEED_CONTEXT();
    count(COUNT_cuPointerGetAttribute);
    range r;
    pinned b;
    if (dev_lookup((void *)(uintptr_t)p, 1, &r))
        return attribute_of(data, attr, 2, r.ctx, r.start, r.end - r.start, r.managed);
    if (pin_lookup((void *)(uintptr_t)p, 1, &b))
        return attribute_of(data, attr, 1, b.ctx, b.start, b.bytes, false);
    return INVALID_VALUE; /* pageable memory, or no memory at all */
}

#define D(p) ((void *)(uintptr_t)(p))

/* A kernel's access of [a, +an) and [b, +bn): checked when the stream gets
 * there (an illegal address then, sticky), as a kernel's addresses are. */
static CUresult submit_kernel(stream *s, op o, CUdeviceptr a, size_t an, CUdeviceptr b, size_t bn)
{
    if (!dev_valid(D(a), an) || (bn && !dev_valid(D(b), bn))) {
        free(o.owned);
        return submit(s, (op){.kind = OP_FAULT});
    }
    return submit(s, o);
}

/* A copy's or memset's device ranges: refused at the call when not inside
 * one allocation each, as the driver checks them. */
static CUresult submit_copy(stream *s, op o, CUdeviceptr a, size_t an, CUdeviceptr b, size_t bn)
{
    if (!dev_valid(D(a), an) || (bn && !dev_valid(D(b), bn))) {
        free(o.owned);
        return INVALID_VALUE;
    }
    return submit(s, o);
}

/* The start of a blocking copy on the legacy stream. */
static CUresult blocking_start(void)
{
    CUresult r = unsafe_call();
    if (r == OK)
        r = legacy_use(current_ctx());
    return r;
}

/* Blocking calls ("API synchronization behavior"). */
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n)
{
    NEED_CONTEXT();
    count(COUNT_cuMemcpyHtoD);
    CUresult r = blocking_start();
    if (r != OK)
        return r;
    if (!dev_valid(D(d), n))
        return INVALID_VALUE;
    drain_legacy();
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
    CUresult r = blocking_start();
    if (r != OK)
        return r;
    if (!dev_valid(D(s), n))
        return INVALID_VALUE;
    drain_legacy();
    memcpy(d, D(s), n); /* returns once done */
    return OK;
}
API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    NEED_CONTEXT(); /* asynchronous to the host */
    return submit_copy(NULL, (op){.kind = OP_COPY, .dst = D(d), .src = D(s), .bytes = n}, d, n, s, n);
}
API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
    NEED_CONTEXT(); /* asynchronous to the host for device memory */
    return submit_copy(NULL, (op){.kind = OP_SET, .dst = D(d), .value = v, .bytes = n}, d, n, 0, 0);
}

/* Pageable memory: like the real driver, wait for the stream, then copy
 * (which a capturing stream cannot do). */
static CUresult host_copy_async(void *dst, const void *src, size_t n, stream *s, const void *host, CUdeviceptr dev)
{
    if (!dev_valid(D(dev), n))
        return INVALID_VALUE;
    if (!is_pinned(host, n)) {
        if (capturing(s))
            return capture_refuses(s);
        drain(s);
        memcpy(dst, src, n);
        return OK;
    }
    gauge_max(COUNT_largest_pinned_async_copy, (long long)n);
    return submit(s, (op){.kind = OP_COPY, .dst = dst, .src = src, .bytes = n});
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
    count(COUNT_cuMemcpyDtoDAsync);
    STREAM_ARG(st);
    return submit_copy(st, (op){.kind = OP_COPY, .dst = D(d), .src = D(s), .bytes = n}, d, n, s, n);
}
API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, stream *st)
{
    NEED_CONTEXT();
    count(COUNT_cuMemsetD8Async);
    STREAM_ARG(st);
    return submit_copy(st, (op){.kind = OP_SET, .dst = D(d), .value = v, .bytes = n}, d, n, 0, 0);
}
/* No peer access between the fake's devices: the driver stages, as it does
 * where the devices cannot reach each other. */
API CUresult cuDeviceCanAccessPeer(int *can, int d, int peer) { (void)d; (void)peer; *can = 0; return OK; }
API CUresult cuCtxEnablePeerAccess(void *peer, unsigned f) { (void)peer; (void)f; NEED_CONTEXT(); return 1; }
API CUresult cuMemcpyPeerAsync(CUdeviceptr d, void *dctx, CUdeviceptr s, void *sctx, size_t n, stream *st)
{
    NEED_CONTEXT();
    STREAM_ARG(st);
    if (ctx_index(dctx) < 0 || ctx_index(sctx) < 0)
        return INVALID_CONTEXT;
    return submit_copy(st, (op){.kind = OP_COPY, .dst = D(d), .src = D(s), .bytes = n}, d, n, s, n);
}

API CUresult cuStreamCreate(stream **out, unsigned flags)
{
    NEED_CONTEXT();
    count(COUNT_cuStreamCreate);
    if (flags & ~1u) /* CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING */
        return INVALID_VALUE;
    stream *s = stream_new(current_ctx(), flags, false);
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
    if (capturing(s))
        return capture_refuses(s);
    UNSAFE_CALL();
    if (s->is_legacy) {
        CUresult r = legacy_use(s->ctx);
        if (r != OK)
            return r;
        drain_legacy();
    } else {
        drain(s);
    }
    int e = __atomic_load_n(&sticky[s->ctx], __ATOMIC_SEQ_CST);
    return e ? e : OK;
}
API CUresult cuStreamDestroy_v2(stream *s)
{
    NEED_CONTEXT();
    count(COUNT_cuStreamDestroy);
    if (!s || s == LEGACY_HANDLE || s == PER_THREAD_HANDLE || !stream_live(s) || s->is_legacy)
        return INVALID_HANDLE; /* the default streams are never destroyed */
    if (capturing(s))
        return capture_refuses(s);
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
    NEED_CONTEXT();
    count(COUNT_cuEventCreate);
    /* DEFAULT, BLOCKING_SYNC, DISABLE_TIMING; INTERPROCESS only with DISABLE_TIMING */
    if ((flags & ~7u) || ((flags & 4) && !(flags & 2)))
        return INVALID_VALUE;
    event *e = event_new(flags);
    if (!e)
        return OUT_OF_MEMORY;
    *out = e;
    return OK;
}
/* After a sticky error the call fails, but the event is gone all the same
 * (a real driver frees it with the context, which must reset). */
API CUresult cuEventDestroy_v2(event *e)
{
    count(COUNT_cuEventDestroy);
    int c = current_ctx();
    int sticky_now = c >= 0 ? __atomic_load_n(&sticky[c], __ATOMIC_SEQ_CST) : 0;
    if (sticky_now && !in_host_fn && e) {
        event_free(e);
        return sticky_now;
    }
    NEED_CONTEXT();
    event_free(e);
    return OK;
}
/* An event recorded on a capturing stream marks that point of the capture:
 * no work runs for it. */
static CUresult record_in_capture(event *e, stream *s, bool *captured)
{
    pthread_mutex_lock(&capture_lock);
    capture *c = s->cap;
    CUresult r = c && c->status != CAPTURE_ACTIVE ? CAPTURE_INVALIDATED : OK;
    *captured = c != NULL;
    e->cap_id = c ? c->id : 0;
    e->cap_stream = c ? s : NULL;
    e->cap_seq = s->appended;
    pthread_mutex_unlock(&capture_lock);
    return r;
}
API CUresult cuEventRecord(event *e, stream *s)
{
    NEED_CONTEXT();
    count(COUNT_cuEventRecord);
    STREAM_ARG(s);
    bool captured;
    CUresult r = record_in_capture(e, s, &captured);
    if (r != OK || captured)
        return r;
    if (s->is_legacy && (r = legacy_use(s->ctx)) != OK)
        return r;
    mark *m = mark_new();
    if (!m)
        return OUT_OF_MEMORY;
    mark_retain(m); /* the event's, and the queued record's */
    pthread_mutex_lock(&e->lock);
    mark *old = e->latest;
    e->latest = m;
    e->recorded = true;
    pthread_mutex_unlock(&e->lock);
    mark_release(old);
    implicit_sync(s);
    return enqueue(s, (op){.kind = OP_RECORD, .ev = m});
}
/* An event of a capture still in progress cannot be queried or waited for
 * by the host: the capture is invalidated. */
static CUresult event_of_active_capture(event *e)
{
    pthread_mutex_lock(&capture_lock);
    capture *c = e->cap_id ? capture_find(e->cap_id) : NULL;
    if (c)
        invalidate(c);
    pthread_mutex_unlock(&capture_lock);
    return c ? CAPTURE_UNSUPPORTED : OK;
}
API CUresult cuEventQuery(event *e)
{
    NEED_CONTEXT();
    count(COUNT_cuEventQuery);
    CUresult r = event_of_active_capture(e);
    if (r == OK)
        r = unsafe_call();
    if (r != OK)
        return r;
    mark *m = event_latest(e);
    bool done = mark_done(m, NULL);
    mark_release(m);
    return done ? OK : NOT_READY;
}
API CUresult cuEventSynchronize(event *e)
{
    NEED_CONTEXT();
    count(COUNT_cuEventSynchronize);
    CUresult r = event_of_active_capture(e);
    if (r == OK)
        r = unsafe_call();
    if (r != OK)
        return r;
    mark *m = event_latest(e);
    if (m)
        mark_wait(m);
    mark_release(m);
    int s = __atomic_load_n(&sticky[current_ctx()], __ATOMIC_SEQ_CST);
    return s ? s : OK;
}

/* FAKE_CUDA_WITHOUT_STREAM_WAIT builds a driver that lacks one required
 * entry point (tests: the back end must refuse it, naming the symbol). */
#ifndef FAKE_CUDA_WITHOUT_STREAM_WAIT
/* A capturing stream waits for an event: only one recorded in the same
 * capture (else the capture is invalidated: ..._ISOLATION); waiting for one
 * recorded on another stream after its last node joins that stream back.
 * capture_lock held. */
static CUresult wait_in_capture(stream *s, event *e, capture *ec)
{
    if (s->cap->status != CAPTURE_ACTIVE)
        return CAPTURE_INVALIDATED;
    if (ec != s->cap) {
        invalidate(s->cap);
        return CAPTURE_ISOLATION;
    }
    stream *from = e->cap_stream;
    if (from && from != s && e->cap_seq >= from->appended)
        from->unjoined = false;
    return OK;
}

API CUresult cuStreamWaitEvent(stream *s, event *e, unsigned f)
{
    NEED_CONTEXT();
    count(COUNT_cuStreamWaitEvent);
    STREAM_ARG(s);
    if (f != 0) /* CU_EVENT_WAIT_EXTERNAL: no external nodes here */
        return INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    capture *ec = e->cap_id ? capture_find(e->cap_id) : NULL;
    CUresult r = OK;
    bool done = true;
    if (s->cap) {
        r = wait_in_capture(s, e, ec);
    } else if (ec) { /* s joins the capture the event belongs to */
        r = ec->status == CAPTURE_ACTIVE ? OK : CAPTURE_INVALIDATED;
        if (r == OK)
            s->cap = ec, s->unjoined = false;
    } else {
        done = e->cap_id != 0; /* an event of an ended capture: nothing to wait for */
    }
    pthread_mutex_unlock(&capture_lock);
    if (done)
        return r;
    mark *m = event_latest(e);
    if (!m)
        return OK; /* never recorded: nothing to wait for */
    r = submit(s, (op){.kind = OP_WAIT, .ev = m});
    if (r != OK)
        mark_release(m);
    return r;
}
#endif

static CUresult elapsed(float *ms, event *a, event *b)
{
    NEED_CONTEXT();
    CUresult r = event_of_active_capture(a);
    if (r == OK)
        r = event_of_active_capture(b);
    if (r != OK)
        return r;
    pthread_mutex_lock(&a->lock);
    bool a_ok = a->recorded && !(a->flags & 2);
    pthread_mutex_unlock(&a->lock);
    pthread_mutex_lock(&b->lock);
    bool b_ok = b->recorded && !(b->flags & 2);
    pthread_mutex_unlock(&b->lock);
    if (!a_ok || !b_ok)
        return INVALID_HANDLE; /* as the driver: never recorded, or made with CU_EVENT_DISABLE_TIMING */
    mark *ma = event_latest(a), *mb = event_latest(b);
    double ta = 0, tb = 0;
    bool done = mark_done(ma, &ta) && mark_done(mb, &tb);
    mark_release(ma);
    mark_release(mb);
    if (!done)
        return NOT_READY;
    *ms = (float)(tb - ta);
    return OK;
}
API CUresult cuEventElapsedTime(float *ms, event *a, event *b)
{
    count(COUNT_cuEventElapsedTime);
    return elapsed(ms, a, b);
}

/* ---- stream capture and graphs ---- */

API CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
    count(COUNT_cuThreadExchangeStreamCaptureMode);
    if (!mode || *mode < MODE_GLOBAL || *mode > MODE_RELAXED)
        return INVALID_VALUE;
    int old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return OK;
}

API CUresult cuStreamBeginCapture_v2(stream *s, int mode)
{
    NEED_CONTEXT();
    if (mode < MODE_GLOBAL || mode > MODE_RELAXED)
        return INVALID_VALUE;
    if (!s || s == LEGACY_HANDLE || s == PER_THREAD_HANDLE)
        return CAPTURE_UNSUPPORTED; /* the legacy stream cannot be captured */
    if (!stream_live(s))
        return INVALID_HANDLE;
    capture *c = calloc(1, sizeof *c);
    graph_body *g = calloc(1, sizeof *g);
    CUresult r = c && g ? OK : OUT_OF_MEMORY;
    pthread_mutex_lock(&capture_lock);
    if (r == OK && (s->cap || s->is_legacy))
        r = ILLEGAL_STATE;
    else if (r == OK && capture_count == (int)(sizeof captures / sizeof captures[0]))
        r = OUT_OF_MEMORY;
    if (r == OK) {
        g->refs = 1;
        *c = (capture){++capture_ids, CAPTURE_ACTIVE, mode, pthread_self(), s, g};
        s->cap = c;
        s->unjoined = false;
        captures[capture_count++] = c;
    }
    pthread_mutex_unlock(&capture_lock);
    if (r != OK) {
        free(c);
        free(g);
    }
    return r;
}

/* Ends capture c (capture_lock held): every stream leaves it; the graph, or
 * an error when the capture was invalidated or a joined stream was never
 * joined back. */
static CUresult capture_end(capture *c, graph_body **graph)
{
    bool unjoined = false;
    pthread_mutex_lock(&registry_lock);
    for (stream *s = live_streams; s; s = s->next_live)
        if (s->cap == c) {
            unjoined |= s != c->origin && s->unjoined;
            s->cap = NULL;
            s->unjoined = false;
        }
    pthread_mutex_unlock(&registry_lock);
    for (int i = 0; i < capture_count; i++)
        if (captures[i] == c)
            captures[i] = captures[--capture_count];
    if (unjoined)
        invalidate(c);
    CUresult r = unjoined ? CAPTURE_UNJOINED : c->status != CAPTURE_ACTIVE ? CAPTURE_INVALIDATED : OK;
    *graph = r == OK ? c->g : NULL;
    if (r != OK)
        body_release(c->g);
    free(c);
    return r;
}

API CUresult cuStreamEndCapture(stream *s, graph_body **graph)
{
    NEED_CONTEXT();
    if (!graph)
        return INVALID_VALUE;
    *graph = NULL;
    if (!s || s == LEGACY_HANDLE || s == PER_THREAD_HANDLE)
        return ILLEGAL_STATE;
    if (!stream_live(s))
        return INVALID_HANDLE;
    pthread_mutex_lock(&capture_lock);
    capture *c = s->cap;
    CUresult r;
    if (!c)
        r = ILLEGAL_STATE;
    else if (c->origin != s)
        r = CAPTURE_UNMATCHED;
    else if (c->mode != MODE_RELAXED && !pthread_equal(c->thread, pthread_self()))
        r = CAPTURE_WRONG_THREAD;
    else
        r = capture_end(c, graph);
    pthread_mutex_unlock(&capture_lock);
    return r;
}

/* The status of a stream's capture; the legacy stream while a stream that
 * synchronizes with it captures: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (a
 * query: nothing is invalidated). */
static CUresult capture_info(stream *s, int *status, unsigned long long *id, graph_body **graph)
{
    NEED_CONTEXT();
    STREAM_ARG(s);
    pthread_mutex_lock(&capture_lock);
    capture *c = s->is_legacy ? NULL : s->cap;
    CUresult r = s->is_legacy && blocking_capture(s->ctx) ? CAPTURE_IMPLICIT : OK;
    if (status)
        *status = !c ? CAPTURE_NONE : c->status == CAPTURE_ACTIVE ? CAPTURE_ACTIVE : CAPTURE_DEAD;
    if (id)
        *id = c ? c->id : 0;
    if (graph)
        *graph = c ? c->g : NULL;
    pthread_mutex_unlock(&capture_lock);
    return r;
}

API CUresult cuStreamIsCapturing(stream *s, int *status)
{
    count(COUNT_cuStreamIsCapturing);
    return capture_info(s, status, NULL, NULL);
}
API CUresult cuStreamGetCaptureInfo(stream *s, int *status, unsigned long long *id)
{
    count(COUNT_cuStreamGetCaptureInfo);
    return capture_info(s, status, id, NULL);
}
API CUresult cuStreamGetCaptureInfo_v2(stream *s, int *status, unsigned long long *id, graph_body **graph,
                                       const void **deps, size_t *ndeps)
{
    count(COUNT_cuStreamGetCaptureInfo);
    if (deps)
        *deps = NULL;
    if (ndeps)
        *ndeps = 0;
    return capture_info(s, status, id, graph);
}
#if FAKE_CUDA_VERSION >= 12030
API CUresult cuStreamGetCaptureInfo_v3(stream *s, int *status, unsigned long long *id, graph_body **graph,
                                       const void **deps, const void **edges, size_t *ndeps)
{
    if (edges)
        *edges = NULL;
    return cuStreamGetCaptureInfo_v2(s, status, id, graph, deps, ndeps);
}
#endif

typedef struct graph_exec {
    graph_body *body;
} graph_exec;

API CUresult cuGraphInstantiateWithFlags(graph_exec **out, graph_body *g, unsigned long long flags)
{
    NEED_CONTEXT();
    if (!out || !g || flags != 0)
        return INVALID_VALUE;
    graph_exec *x = malloc(sizeof *x);
    if (!x)
        return OUT_OF_MEMORY;
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_ACQ_REL);
    x->body = g;
    *out = x;
    return OK;
}

/* The graph's nodes in order on the stream, then the launch's hold on them
 * goes. */
API CUresult cuGraphLaunch(graph_exec *x, stream *s)
{
    NEED_CONTEXT();
    STREAM_ARG(s);
    if (!x)
        return INVALID_VALUE;
    if (capturing(s))
        return capture_refuses(s); /* no child graphs here */
    count(COUNT_graph_launches);
    graph_body *g = x->body;
    CUresult r = OK;
    for (size_t i = 0; i < g->count && r == OK; i++) {
        op o = g->nodes[i];
        o.owned = NULL; /* the graph's */
        r = submit(s, o);
    }
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_ACQ_REL);
    if (submit(s, (op){.kind = OP_GRAPH_END, .user = g}) != OK)
        body_release(g);
    return r;
}
API CUresult cuGraphExecDestroy(graph_exec *x)
{
    if (!x)
        return INVALID_VALUE;
    body_release(x->body);
    free(x);
    return OK;
}
API CUresult cuGraphDestroy(graph_body *g)
{
    if (!g)
        return INVALID_VALUE;
    body_release(g);
    return OK;
}

/* User objects (CUDA 11.3): a destructor run when the last reference goes;
 * graphs hold references (cuGraphRetainUserObject, also on the graph of a
 * capture in progress), given up when the graph and its executables are
 * gone and their launches done. flags must be
 * CU_USER_OBJECT_NO_DESTRUCTOR_SYNC (1), as the driver requires. */
API CUresult cuUserObjectCreate(user_object **out, void *ptr, host_fn destroy, unsigned initial, unsigned flags)
{
    NEED_CONTEXT();
    count(COUNT_cuUserObjectCreate);
    if (!out || !destroy || initial == 0 || initial > 0x7fffffff || flags != 1)
        return INVALID_VALUE;
    user_object *o = malloc(sizeof *o);
    if (!o)
        return OUT_OF_MEMORY;
    *o = (user_object){destroy, ptr, (int)initial};
    *out = o;
    return OK;
}
API CUresult cuUserObjectRelease(user_object *o, unsigned n)
{
    if (!o || n == 0 || n > (unsigned)__atomic_load_n(&o->refs, __ATOMIC_ACQUIRE))
        return INVALID_VALUE;
    user_object_release(o, n);
    return OK;
}
/* flags: CU_GRAPH_USER_OBJECT_MOVE (1) takes the caller's references. */
API CUresult cuGraphRetainUserObject(graph_body *g, user_object *o, unsigned n, unsigned flags)
{
    NEED_CONTEXT();
    if (!g || !o || n == 0 || (flags & ~1u))
        return INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    CUresult r = OK;
    if (g->n_held == g->cap_held) {
        size_t cap = g->cap_held ? 2 * g->cap_held : 4;
        held_object *h = realloc(g->held, cap * sizeof *h);
        if (h) {
            g->held = h;
            g->cap_held = cap;
        } else {
            r = OUT_OF_MEMORY;
        }
    }
    if (r == OK) {
        g->held[g->n_held++] = (held_object){o, n};
        if (!(flags & 1))
            __atomic_add_fetch(&o->refs, (int)n, __ATOMIC_ACQ_REL);
    }
    pthread_mutex_unlock(&capture_lock);
    return r;
}

/* ---- batch copies and prefetches ---- */

typedef struct { int type, id; } location;
typedef struct { int order; location src, dst; unsigned flags; } copy_attrs;

#if FAKE_CUDA_VERSION >= 12080
/* The batch copy, shared by both signatures. */
static CUresult batch_copy(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count_, copy_attrs *attrs,
                           size_t *idxs, size_t nattrs, size_t *fail_idx, stream *s)
{
    NEED_CONTEXT();
    if (fail_idx)
        *fail_idx = SIZE_MAX; /* an error not tied to one copy */
    if (!s || s == LEGACY_HANDLE || !attrs || !idxs || nattrs == 0 || idxs[0] != 0 || attrs[0].order != 1)
        return INVALID_VALUE; /* the real call refuses the legacy stream, and needs an order */
    STREAM_ARG(s);
    if (capturing(s))
        return capture_refuses(s); /* a graph would miss the copies (CUDA 13): refused here */
    for (size_t i = 0; i < count_; i++) {
        CUresult r = submit_copy(s, (op){.kind = OP_COPY, .dst = D(dsts[i]), .src = D(srcs[i]), .bytes = sizes[i]},
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
#endif

static CUresult prefetch(CUdeviceptr p, size_t n, stream *s)
{
    if (capturing(s))
        return capture_refuses(s);
    return submit_copy(s, (op){.kind = OP_SET, .bytes = 0, .dst = D(p)}, p, n, 0, 0);
}

/* The CUDA 8 prefetch (its 12.x name; CUDA 13 maps the name to _v2). */
API CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t n, int to, stream *s)
{
    NEED_CONTEXT();
    count(COUNT_cuMemPrefetchAsync);
    STREAM_ARG(s);
    if (to != -1 && (to < 0 || to >= device_count))
        return INVALID_DEVICE;
    return prefetch(p, n, s);
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
    if (f != 0 || (to.type != 1 && to.type != 2) || (to.type == 1 && (to.id < 0 || to.id >= device_count)))
        return INVALID_VALUE;
    return prefetch(p, n, s);
}

API CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count_,
                                   copy_attrs *attrs, size_t *idxs, size_t nattrs, stream *s)
{
    count(COUNT_cuMemcpyBatchAsync_v2);
    return batch_copy(dsts, srcs, sizes, count_, attrs, idxs, nattrs, NULL, s);
}
#endif

/* ---- modules: the back end's kernels and the examples' saxpy and jacobi,
 * emulated on the stream, from PTX the fake's JIT accepts ---- */
static int module_token, function_token, saxpy_token, jacobi_token, diff_token, table_token;
static bool module_has_diff;  /* the back end's module carries mapping_diff_blocks */
static bool module_has_table; /* ... and mapping_copy_table */
static bool *loaded_flag(void *fn)
{
    return fn == &function_token ? &function_loaded : fn == &saxpy_token ? &saxpy_loaded
                                                     : fn == &jacobi_token ? &jacobi_loaded
                                                     : fn == &diff_token   ? &diff_loaded
                                                     : fn == &table_token  ? &table_loaded : NULL;
}

/* The newest PTX ISA the profile's JIT reads, as major * 10 + minor. */
static int ptx_isa_max(void)
{
    const char *v = getenv("FAKE_LIBCUDA_PTX_ISA_MAX");
    int major = 0, minor = 0;
    if (v && sscanf(v, "%d.%d", &major, &minor) == 2)
        return major * 10 + minor;
    return FAKE_CUDA_VERSION >= 13000 ? 90 : FAKE_CUDA_VERSION >= 12080 ? 87 : 82;
}

/* The line (1-based) of the first occurrence of `what` in the image. */
static int line_of(const char *image, const char *what)
{
    int line = 1;
    for (const char *c = image; c < what; c++)
        line += *c == '\n';
    return line;
}

/* What ptxas says of the image, into log; the CUresult of loading it. */
static CUresult jit(const char *image, char *log, size_t cap)
{
    const char *v = strstr(image, ".version "), *t = strstr(image, ".target ");
    int major = 0, minor = 0, sm = 0, max = ptx_isa_max();
    if (!v || !t || sscanf(v + 9, "%d.%d", &major, &minor) != 2 || sscanf(t + 8, "sm_%d", &sm) != 1) {
        snprintf(log, cap, "ptxas fatal   : the input is not PTX: no .version or .target directive it can read");
        return INVALID_PTX;
    }
    if (major * 10 + minor > max) {
        snprintf(log, cap, "ptxas application ptx input, line %d; fatal   : Unsupported .version %d.%d; current version is '%d.%d'",
                 line_of(image, v), major, minor, max / 10, max % 10);
        return UNSUPPORTED_PTX_VERSION;
    }
    if (sm > DEVICE_SM) {
        snprintf(log, cap, "ptxas fatal   : SM version specified by .target (sm_%d) is higher than default SM version assumed (sm_%d)",
                 sm, DEVICE_SM);
        return INVALID_PTX;
    }
    if (!strstr(image, ".entry mapping_copy_entries") && !strstr(image, ".entry saxpy") &&
        !strstr(image, ".entry jacobi(")) {
        snprintf(log, cap, "fake libcuda: the PTX has none of the kernels this fake can run");
        return INVALID_PTX;
    }
    if (cap)
        log[0] = '\0';
    return OK;
}

/* CU_JIT_ERROR_LOG_BUFFER (5) and _SIZE_BYTES (6) among the options: the
 * buffer, its size; the size option's value becomes the bytes written. */
static void jit_log_option(unsigned n, const int *options, void **values, char **buf, size_t *cap, int *size_at)
{
    for (unsigned i = 0; options && values && i < n; i++) {
        if (options[i] == 5)
            *buf = values[i];
        else if (options[i] == 6)
            *cap = (size_t)(uintptr_t)values[i], *size_at = (int)i;
    }
}

static CUresult module_load(void **module, const void *image, unsigned n, const int *options, void **values)
{
    NEED_CONTEXT();
    count(COUNT_cuModuleLoadData);
    UNSAFE_CALL();
    synchronize_all_streams("cuModuleLoadData (loading a module may synchronize the context)");
    char own[512], *log = own;
    size_t cap = sizeof own;
    int size_at = -1;
    jit_log_option(n, options, values, &log, &cap, &size_at);
    if (!log || cap == 0)
        log = own, cap = sizeof own;
    CUresult r = jit(image, log, cap);
    if (size_at >= 0)
        values[size_at] = (void *)(uintptr_t)(log == own ? 0 : strlen(log) + (log[0] != '\0'));
    if (r != OK)
        return r;
    if (strstr(image, ".entry mapping_copy_entries")) {
        copy_entries_split = strstr(image, "mapping_copy_entries_param_5") != NULL;
        module_has_diff = strstr(image, ".entry mapping_diff_blocks") != NULL;
        module_has_table = strstr(image, ".entry mapping_copy_table") != NULL;
    }
    *module = &module_token;
    return OK;
}
API CUresult cuModuleLoadData(void **module, const void *image)
{
    return module_load(module, image, 0, NULL, NULL);
}
API CUresult cuModuleLoadDataEx(void **module, const void *image, unsigned n, int *options, void **values)
{
    return module_load(module, image, n, options, values);
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
    else if (strcmp(name, "mapping_copy_table") == 0 && module_has_table)
        *fn = &table_token;
    else
        return NOT_FOUND;
    return OK;
}

#if FAKE_CUDA_VERSION >= 12040
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
#endif

/* The device's launch limits (sm_75): CUDA_ERROR_INVALID_VALUE beyond them. */
static bool launch_fits(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shared)
{
    return gx && gy && gz && bx && by && bz && gx <= 0x7fffffffu && gy <= 65535 && gz <= 65535 && bx <= 1024 &&
           by <= 1024 && bz <= 64 && (unsigned long long)bx * by * bz <= 1024 && shared <= 48 * 1024;
}

static CUresult launch_jacobi(stream *s, unsigned gx, unsigned gy, unsigned bx, unsigned by, void **params)
{
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
    return submit_kernel(s, (op){.kind = OP_JACOBI, .src = D(u), .dst = D(v), .user = a, .owned = a}, u, n, v, n);
}

static CUresult launch_diff(stream *s, unsigned gx, unsigned gy, void **params)
{
    CUdeviceptr a = *(CUdeviceptr *)params[0], sh = *(CUdeviceptr *)params[1], fl = *(CUdeviceptr *)params[2];
    unsigned long long blocks = *(unsigned long long *)params[3];
    if ((unsigned long long)gx * gy < blocks)
        return INVALID_VALUE; /* a real launch would leave blocks out: refuse it here */
    if (blocks && !dev_valid(D(fl), blocks))
        return submit(s, (op){.kind = OP_FAULT});
    if (!blocks) /* every block returns at once: nothing is read */
        return submit(s, (op){.kind = OP_SET, .bytes = 0, .dst = NULL});
    return submit_kernel(s, (op){.kind = OP_DIFF, .src = D(a), .dst = D(sh), .user = D(fl), .bytes = blocks}, a,
                         blocks * 4096, sh, blocks * 4096);
}

/* table, capacity, host, device, to_host: read when it runs (run_copy_table). */
static CUresult launch_copy_table(stream *s, unsigned gy, unsigned bx, void **params)
{
    CUdeviceptr table = *(CUdeviceptr *)params[0];
    unsigned long long capacity = *(unsigned long long *)params[1];
    if (table % 8)
        return 716; /* CUDA_ERROR_MISALIGNED_ADDRESS */
    if (bx % 32 != 0 || gy != 1)
        return INVALID_VALUE; /* a warp per entry, one-dimensional */
    return submit(s, (op){.kind = OP_TABLE, .user = D(table), .bytes = (size_t)capacity,
                          .src = D(*(CUdeviceptr *)params[2]), .dst = D(*(CUdeviceptr *)params[3]),
                          .value = (int)*(unsigned *)params[4]});
}

static CUresult launch_copy_entries(stream *s, unsigned bx, unsigned gy, void **params)
{
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
    (void)extra;
    NEED_CONTEXT();
    count(COUNT_cuLaunchKernel);
    STREAM_ARG(s);
    if (!flag || !launch_fits(gx, gy, gz, bx, by, bz, shared))
        return INVALID_VALUE;
    if (fn == &jacobi_token) /* u, v, cols, first_row, rows, owned, halo; the grid must cover the block */
        return launch_jacobi(s, gx, gy, bx, by, params);
    if (fn == &table_token)
        return launch_copy_table(s, gy, bx, params);
    if (fn == &diff_token) /* mem, shadow, flags, blocks; the grid must cover the blocks */
        return launch_diff(s, gx, gy, params);
    if (fn == &saxpy_token) { /* whole numbers only: the example's a is 2 */
        CUdeviceptr x = *(CUdeviceptr *)params[1], y = *(CUdeviceptr *)params[2];
        size_t n = *(unsigned *)params[3];
        return submit_kernel(s, (op){.kind = OP_SAXPY, .value = (int)*(float *)params[0], .src = D(x), .dst = D(y),
                                     .bytes = n},
                             x, n * sizeof(float), y, n * sizeof(float));
    }
    return launch_copy_entries(s, bx, gy, params);
}
