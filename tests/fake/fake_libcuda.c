/*
 * A fake libcuda for tests: the part of the CUDA driver API the cuda back end
 * uses, run on the CPU, so the back end's own logic runs on machines without
 * a GPU (ctest label fakecuda: the conformance, internal and cuda-only tests
 * with MAPPING_CUDA_LIBRARY pointing here). It checks what a real driver would
 * refuse and copies its awkward behaviour where the back end must cope:
 * - calls that need a context fail with CUDA_ERROR_INVALID_CONTEXT when none
 *   is current on the calling thread (contexts are per thread);
 * - driver calls from a host function fail (CUDA_ERROR_NOT_PERMITTED);
 * - an Async copy to or from pageable memory waits for its stream first, as
 *   the real driver may (so a back end that relies on it would hang);
 * - cuGetErrorName is not exported (the back end names errors itself).
 * Streams are worker threads; device memory is malloc. It proves nothing
 * about real GPUs: tests/gpu/run.sh does that.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void (*host_fn)(void *);
enum {
    OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, INVALID_CONTEXT = 201, NOT_FOUND = 500, NOT_READY = 600,
    NOT_PERMITTED = 800, HOST_MEMORY_NOT_REGISTERED = 713,
};

static bool initialized;
static _Thread_local bool in_host_fn;

/* ---- contexts: one primary context, a stack per thread ---- */
typedef struct context { int refs; } context;
static context primary;
static _Thread_local context *ctx_stack[16];
static _Thread_local int ctx_depth;

#define NEED_CONTEXT()                    \
    do {                                  \
        if (in_host_fn)                   \
            return NOT_PERMITTED;         \
        if (!initialized)                 \
            return NOT_INITIALIZED;       \
        if (ctx_depth == 0)               \
            return INVALID_CONTEXT;       \
    } while (0)

/* ---- page-locked host memory: what the back end got from us ---- */
typedef struct pinned { uintptr_t start; size_t bytes; bool allocated; } pinned;
static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;
static pinned pins[4096];
static int pin_count;

static bool is_pinned(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    bool found = false;
    pthread_mutex_lock(&pinned_lock);
    for (int i = 0; i < pin_count && !found; i++)
        found = a >= pins[i].start && a + n <= pins[i].start + pins[i].bytes;
    pthread_mutex_unlock(&pinned_lock);
    return found;
}

static CUresult pin_add(void *p, size_t n, bool allocated)
{
    pthread_mutex_lock(&pinned_lock);
    CUresult r = pin_count < 4096 ? OK : INVALID_VALUE;
    if (r == OK)
        pins[pin_count++] = (pinned){(uintptr_t)p, n, allocated};
    pthread_mutex_unlock(&pinned_lock);
    return r;
}

static CUresult pin_remove(void *p)
{
    CUresult r = HOST_MEMORY_NOT_REGISTERED;
    pthread_mutex_lock(&pinned_lock);
    for (int i = 0; i < pin_count; i++)
        if (pins[i].start == (uintptr_t)p) {
            pins[i] = pins[--pin_count];
            r = OK;
            break;
        }
    pthread_mutex_unlock(&pinned_lock);
    return r;
}

/* ---- events ---- */
typedef struct event {
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    bool            done;
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

static void event_complete(event *e)
{
    pthread_mutex_lock(&e->lock);
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

/* ---- streams: a worker thread each; stream 0 runs work inline ---- */
typedef enum { OP_COPY, OP_SET, OP_HOST_FN, OP_RECORD, OP_WAIT, OP_KERNEL, OP_SAXPY } op_kind;
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
} op;

typedef struct stream {
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    op             *head, *tail;
    bool            busy, quit;
    pthread_t       thread;
} stream;

typedef struct { unsigned long long staging_offset, buffer_offset, bytes; } entry;

/* The back end's mapping_copy_entries kernel: dst = buffer, src = staging,
 * user = the table (read when the kernel runs, as on a GPU), bytes = count,
 * value = gather. */
static void run_copy_entries(op *o)
{
    const entry *table = o->user;
    for (size_t i = 0; i < o->bytes; i++) {
        unsigned char *at_staging = (unsigned char *)o->src + table[i].staging_offset;
        unsigned char *at_buffer = (unsigned char *)o->dst + table[i].buffer_offset;
        if (o->value)
            memmove(at_staging, at_buffer, table[i].bytes);
        else
            memmove(at_buffer, at_staging, table[i].bytes);
    }
}

static void run_op(op *o)
{
    switch (o->kind) {
    case OP_COPY: memmove(o->dst, o->src, o->bytes); break;
    case OP_SET: memset(o->dst, o->value, o->bytes); break;
    case OP_HOST_FN:
        in_host_fn = true;
        o->fn(o->user);
        in_host_fn = false;
        break;
    case OP_RECORD: event_complete(o->ev); event_release(o->ev); break;
    case OP_WAIT: event_wait(o->ev); event_release(o->ev); break;
    case OP_KERNEL: run_copy_entries(o); break;
    case OP_SAXPY: /* examples/kernels/scale.cu: y = a*x + y; value = a, src = x, dst = y, bytes = n */
        for (size_t i = 0; i < o->bytes; i++)
            ((float *)o->dst)[i] = (float)o->value * ((const float *)o->src)[i] + ((float *)o->dst)[i];
        break;
    }
}

static void *worker(void *arg)
{
    stream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->quit)
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

static CUresult submit(stream *s, op o)
{
    if (!s) { /* the legacy stream: everything before is done */
        run_op(&o);
        return OK;
    }
    op *p = malloc(sizeof *p);
    if (!p)
        return INVALID_VALUE;
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

static void drain(stream *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    while (s->head || s->busy)
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
}

/* ---- the API ---- */

API CUresult cuInit(unsigned flags) { (void)flags; initialized = true; return OK; }
API CUresult cuDriverGetVersion(int *v) { *v = 12080; return OK; }
API CUresult cuDeviceGetCount(int *n) { if (!initialized) return NOT_INITIALIZED; *n = 1; return OK; }
API CUresult cuDeviceGet(int *d, int i) { if (i != 0) return 101; *d = 0; return OK; }
API CUresult cuDeviceGetName(char *name, int len, int d)
{
    (void)d;
    strncpy(name, "Fake CUDA device (tests/fake/fake_libcuda.c)", (size_t)len - 1);
    name[len - 1] = '\0';
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
API CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) { (void)d; __atomic_add_fetch(&primary.refs, 1, __ATOMIC_SEQ_CST); *ctx = &primary; return OK; }
API CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return __atomic_sub_fetch(&primary.refs, 1, __ATOMIC_SEQ_CST) >= 0 ? OK : INVALID_CONTEXT; }
API CUresult cuCtxGetCurrent(void **ctx) { *ctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; return OK; }
API CUresult cuCtxPushCurrent_v2(void *ctx)
{
    if (ctx != &primary || ctx_depth == 16)
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

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { NEED_CONTEXT(); void *m = malloc(n); if (!m) return 2; *p = (uintptr_t)m; return OK; }
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) { (void)f; return cuMemAlloc_v2(p, n); }
API CUresult cuMemFree_v2(CUdeviceptr p) { NEED_CONTEXT(); free((void *)(uintptr_t)p); return OK; }
API CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags)
{
    (void)flags;
    NEED_CONTEXT();
    /* FAKE_LIBCUDA_MISALIGN_HOST=1: blocks 64 bytes past a page boundary, to
     * test the back end's page-alignment fallback. */
    size_t skew = getenv("FAKE_LIBCUDA_MISALIGN_HOST") ? 64 : 0;
    void *base;
    if (posix_memalign(&base, 4096, n + skew))
        return 2;
    *p = (char *)base + skew;
    return pin_add(*p, n, true);
}
API CUresult cuMemFreeHost(void *p)
{
    NEED_CONTEXT();
    CUresult r = pin_remove(p);
    if (r == OK)
        free((char *)p - ((uintptr_t)p % 4096));
    return r;
}
API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f) { (void)f; NEED_CONTEXT(); return pin_add(p, n, false); }
API CUresult cuMemHostUnregister(void *p) { NEED_CONTEXT(); return pin_remove(p); }

#define D(p) ((void *)(uintptr_t)(p))
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { NEED_CONTEXT(); memcpy(D(d), s, n); return OK; }
API CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { NEED_CONTEXT(); memcpy(d, D(s), n); return OK; }
API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { NEED_CONTEXT(); memmove(D(d), D(s), n); return OK; }
API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { NEED_CONTEXT(); memset(D(d), v, n); return OK; }

/* Pageable memory: like the real driver, wait for the stream, then copy. */
static CUresult host_copy_async(void *dst, const void *src, size_t n, stream *s, const void *host)
{
    if (!is_pinned(host, n)) {
        drain(s);
        memcpy(dst, src, n);
        return OK;
    }
    return submit(s, (op){.kind = OP_COPY, .dst = dst, .src = src, .bytes = n});
}
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, stream *st) { NEED_CONTEXT(); return host_copy_async(D(d), s, n, st, s); }
API CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, stream *st) { NEED_CONTEXT(); return host_copy_async(d, D(s), n, st, d); }
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, stream *st) { NEED_CONTEXT(); return submit(st, (op){.kind = OP_COPY, .dst = D(d), .src = D(s), .bytes = n}); }
/* One device: peer access to itself is refused, as the driver does. */
API CUresult cuDeviceCanAccessPeer(int *can, int d, int peer) { (void)d; (void)peer; *can = 0; return OK; }
API CUresult cuCtxEnablePeerAccess(void *peer, unsigned f) { (void)peer; (void)f; NEED_CONTEXT(); return 1; }
API CUresult cuMemcpyPeerAsync(CUdeviceptr d, void *dctx, CUdeviceptr s, void *sctx, size_t n, stream *st)
{
    NEED_CONTEXT();
    if (dctx != &primary || sctx != &primary)
        return INVALID_CONTEXT;
    return submit(st, (op){.kind = OP_COPY, .dst = D(d), .src = D(s), .bytes = n});
}
API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, stream *st) { NEED_CONTEXT(); return submit(st, (op){.kind = OP_SET, .dst = D(d), .value = v, .bytes = n}); }

API CUresult cuStreamCreate(stream **out, unsigned flags)
{
    (void)flags;
    NEED_CONTEXT();
    stream *s = calloc(1, sizeof *s);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    pthread_create(&s->thread, NULL, worker, s);
    *out = s;
    return OK;
}
API CUresult cuStreamSynchronize(stream *s) { NEED_CONTEXT(); drain(s); return OK; }
API CUresult cuStreamDestroy_v2(stream *s)
{
    NEED_CONTEXT();
    pthread_mutex_lock(&s->lock);
    s->quit = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    free(s);
    return OK;
}
API CUresult cuLaunchHostFunc(stream *s, host_fn fn, void *user) { NEED_CONTEXT(); return submit(s, (op){.kind = OP_HOST_FN, .fn = fn, .user = user}); }

API CUresult cuEventCreate(event **out, unsigned flags)
{
    (void)flags;
    NEED_CONTEXT();
    event *e = calloc(1, sizeof *e);
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->cond, NULL);
    e->done = true; /* an event never recorded counts as complete */
    e->refs = 1;
    *out = e;
    return OK;
}
API CUresult cuEventDestroy_v2(event *e) { NEED_CONTEXT(); event_release(e); return OK; }
API CUresult cuEventRecord(event *e, stream *s)
{
    NEED_CONTEXT();
    pthread_mutex_lock(&e->lock);
    e->done = false;
    e->refs++;
    pthread_mutex_unlock(&e->lock);
    CUresult r = submit(s, (op){.kind = OP_RECORD, .ev = e});
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
API CUresult cuEventSynchronize(event *e) { NEED_CONTEXT(); event_wait(e); return OK; }
/* FAKE_CUDA_WITHOUT_STREAM_WAIT builds a driver that lacks one required
 * entry point (tests: the back end must refuse it, naming the symbol). */
#ifndef FAKE_CUDA_WITHOUT_STREAM_WAIT
API CUresult cuStreamWaitEvent(stream *s, event *e, unsigned f)
{
    (void)f;
    NEED_CONTEXT();
    event_retain(e);
    CUresult r = submit(s, (op){.kind = OP_WAIT, .ev = e});
    if (r != OK)
        event_release(e);
    return r;
}
#endif
API CUresult cuEventElapsedTime(float *ms, event *a, event *b)
{
    NEED_CONTEXT();
    if (cuEventQuery(a) != OK || cuEventQuery(b) != OK)
        return NOT_READY;
    *ms = (float)(b->ms - a->ms);
    return OK;
}

typedef struct { int type, id; } location;
API CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, location to, unsigned f, stream *s)
{
    (void)p, (void)n, (void)to, (void)f, (void)s;
    NEED_CONTEXT();
    return OK;
}

typedef struct { int order; location src, dst; unsigned flags; } copy_attrs;
API CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                   copy_attrs *attrs, size_t *idxs, size_t nattrs, stream *s)
{
    NEED_CONTEXT();
    if (!s || !attrs || !idxs || nattrs == 0 || attrs[0].order != 1)
        return INVALID_VALUE; /* the real call refuses the legacy stream, and needs an order */
    for (size_t i = 0; i < count; i++) {
        CUresult r = submit(s, (op){.kind = OP_COPY, .dst = D(dsts[i]), .src = D(srcs[i]), .bytes = sizes[i]});
        if (r != OK)
            return r;
    }
    return OK;
}

/* Modules: the back end's kernel and the example's saxpy, emulated on the stream. */
static int module_token, function_token, saxpy_token;
API CUresult cuModuleLoadData(void **module, const void *image)
{
    NEED_CONTEXT();
    if (!strstr(image, ".entry mapping_copy_entries") && !strstr(image, ".entry saxpy"))
        return 218; /* CUDA_ERROR_INVALID_PTX */
    *module = &module_token;
    return OK;
}
API CUresult cuModuleUnload(void *module) { NEED_CONTEXT(); return module == &module_token ? OK : 400; }
API CUresult cuModuleGetFunction(void **fn, void *module, const char *name)
{
    NEED_CONTEXT();
    if (module != &module_token)
        return NOT_FOUND;
    if (strcmp(name, "mapping_copy_entries") == 0)
        *fn = &function_token;
    else if (strcmp(name, "saxpy") == 0)
        *fn = &saxpy_token;
    else
        return NOT_FOUND;
    return OK;
}

API CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shared, stream *s, void **params, void **extra)
{
    (void)gy, (void)gz, (void)by, (void)bz, (void)shared, (void)extra;
    NEED_CONTEXT();
    if ((fn != &function_token && fn != &saxpy_token) || gx == 0 || bx == 0 || bx > 1024)
        return INVALID_VALUE;
    if (fn == &saxpy_token) /* whole numbers only: the example's a is 2 */
        return submit(s, (op){.kind = OP_SAXPY, .value = (int)*(float *)params[0], .src = D(*(CUdeviceptr *)params[1]),
                              .dst = D(*(CUdeviceptr *)params[2]), .bytes = *(unsigned *)params[3]});
    CUdeviceptr table = *(CUdeviceptr *)params[1];
    if (table % 8)
        return 716; /* CUDA_ERROR_MISALIGNED_ADDRESS */
    return submit(s, (op){.kind = OP_KERNEL, .src = D(*(CUdeviceptr *)params[0]), .user = D(table),
                          .bytes = (size_t)*(unsigned long long *)params[2], .dst = D(*(CUdeviceptr *)params[3]),
                          .value = (int)*(unsigned *)params[4]});
}
