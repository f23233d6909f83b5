/*
 * What the cuda back end does behind the caller's back, checked with the
 * strict fake driver (tests/fake/fake_libcuda.c; SKIP on any other driver):
 *   - a blocking peer copy and a blocking scatter run on the device's
 *     internal (non-blocking) stream, ordered after the work already queued
 *     on the legacy stream, the device's native queue (the fake holds that
 *     work back: the blocking call must see what it writes);
 *   - the scatter/gather and diff kernels are loaded at open (cuFuncLoad), never by a
 *     blocking flush: under lazy loading, a load may synchronize the context
 *     and hang behind a stream the caller holds (the fake aborts there);
 *   - the link is measured at open on a private stream: asking for it makes
 *     no synchronous copy and no wait on the legacy stream (which would wait
 *     for the user's own work, PyTorch's say).
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include "harness.h"
#include "backend/cuda/cuda_device.h"

extern const mapping_backend mapping_backend_cuda;

typedef struct fake_driver {
    long long (*count)(const char *name);
    void (*hold_legacy)(int on);
    int (*push)(void *ctx);
    int (*pop)(void **ctx);
    int (*memset_async)(unsigned long long dst, unsigned char value, size_t bytes, void *stream);
} fake_driver;

/* The fake's test entry points and the driver calls the tests make; SKIP on
 * any other driver. */
static fake_driver fake(void)
{
    const char *path = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = path && *path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    fake_driver f = {0};
    if (lib) {
        *(void **)&f.count = dlsym(lib, "fake_cuda_count");
        *(void **)&f.hold_legacy = dlsym(lib, "fake_cuda_hold_legacy");
        *(void **)&f.push = dlsym(lib, "cuCtxPushCurrent_v2");
        *(void **)&f.pop = dlsym(lib, "cuCtxPopCurrent_v2");
        *(void **)&f.memset_async = dlsym(lib, "cuMemsetD8Async");
    }
    if (!f.count || !f.hold_legacy || !f.push || !f.pop || !f.memset_async || f.count("lazy_loads") < 0)
        test_skip("the loaded libcuda is not tests/fake/fake_libcuda.c with fake_cuda_hold_legacy");
    return f;
}

static mapping_device *open_cuda(void)
{
    mapping_device *dev = test_device();
    if (strcmp(mapping_backend_name(dev), "cuda") != 0)
        test_skip("for the cuda back end; this is %s", mapping_backend_name(dev));
    return dev;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Work on the legacy stream the fake holds back: fill `bytes` at the device
 * address with `value`. */
static void held_fill_on_legacy(const fake_driver *f, void *ctx, unsigned long long at, unsigned char value,
                                size_t bytes)
{
    void *popped;
    f->hold_legacy(1);
    CHECK(f->push(ctx) == 0);
    CHECK(f->memset_async(at, value, bytes, NULL) == 0); /* stream 0: the legacy stream */
    CHECK(f->pop(&popped) == 0);
}

/* Runs call(arg) on a thread; lets it go on alone for up to 300 ms (a call
 * ordered after the held work cannot finish), then releases the legacy
 * stream and waits for it. Returns whether it had finished while held. */
typedef struct blocking_call {
    void *(*call)(void *);
    void *arg;
    int   done;
} blocking_call;

static void *run_blocking(void *p)
{
    blocking_call *c = p;
    c->call(c->arg);
    __atomic_store_n(&c->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static bool run_while_held(const fake_driver *f, blocking_call *c)
{
    pthread_t t;
    CHECK(pthread_create(&t, NULL, run_blocking, c) == 0);
    for (int i = 0; i < 30 && !__atomic_load_n(&c->done, __ATOMIC_SEQ_CST); i++)
        sleep_ms(10);
    bool early = __atomic_load_n(&c->done, __ATOMIC_SEQ_CST);
    f->hold_legacy(0);
    pthread_join(t, NULL);
    return early;
}

enum { N = 4096 };

typedef struct peer_args {
    mapping_buffer *src, *dst;
    mapping_status  st;
} peer_args;

static void *peer_call(void *p)
{
    peer_args *a = p;
    a->st = mapping_copy_peer(NULL, a->src, 0, a->dst, 0, N);
    return NULL;
}

TEST(cuda_blocking_peer_copy_is_ordered_after_the_legacy_stream)
{
    mapping_device *dev = open_cuda();
    fake_driver f = fake();
    mapping_device *other; /* a second object of device 0 stands in for a second device */
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = "cuda"}, &other));
    unsigned char old[N], back[N], expect[N];
    memset(old, 0xaa, N);
    memset(expect, 0x55, N);
    memset(back, 0, N);
    peer_args a = {0};
    CHECK_OK(mapping_allocate_gpu(dev, N, &a.src));
    CHECK_OK(mapping_allocate_gpu(other, N, &a.dst));
    CHECK_OK(mapping_sync_to_gpu(old, a.src));
    CHECK_OK(mapping_sync_to_gpu(back, a.dst));
    mapping_native_device native;
    void *src_ptr;
    CHECK_OK(mapping_device_native(dev, &native));
    CHECK_OK(mapping_buffer_native(a.src, &src_ptr));
    held_fill_on_legacy(&f, native.context, (uintptr_t)src_ptr, 0x55, N);
    blocking_call c = {peer_call, &a, 0};
    bool early = run_while_held(&f, &c);
    CHECK_OK(a.st);
    printf("blocking peer copy %s while the legacy stream held the fill\n", early ? "finished" : "waited");
    CHECK(!early);
    CHECK_OK(mapping_sync_to_cpu(a.dst, back));
    CHECK_BYTES(back, expect, N); /* the fill's bytes, not the older ones */
    mapping_free_gpu(a.src);
    mapping_free_gpu(a.dst);
    mapping_close(other);
}

typedef struct scatter_args {
    void                 *state, *staging, *dst;
    mapping_scatter_entry table[4];
    mapping_status        st;
} scatter_args;

static void *scatter_call(void *p)
{
    scatter_args *a = p;
    a->st = mapping__cuda_scatter(a->state, NULL, a->staging, N, a->table, 4, a->dst);
    return NULL;
}

/* On the back end itself: the blocking scatter (stream == NULL), by the
 * kernel (auto) and by the driver's batch copy where it has one. */
static void blocking_scatter_waits_for_the_legacy_stream(fake_driver f, const char *mode)
{
    const mapping_backend *be = &mapping_backend_cuda;
    char why[256];
    int count = 0;
    CHECK_OK(be->load(why, sizeof why, &count));
    scatter_args a = {0};
    setenv("MAPPING_CUDA_SCATTER", mode, 1); /* read when the device opens */
    mapping_status opened = be->device_open(0, NULL, &a.state);
    unsetenv("MAPPING_CUDA_SCATTER");
    CHECK_OK(opened);
    /* The staging holds the data in [0, N) and, for the scatter kernel, the
     * table at N (as the core lays them out); the held fill covers the data. */
    CHECK_OK(be->buffer_alloc(a.state, N + sizeof a.table, &a.staging));
    CHECK_OK(be->buffer_alloc(a.state, N, &a.dst));
    unsigned char zero[N], back[N], expect[N];
    memset(zero, 0, N);
    memset(expect, 0, N);
    CHECK_OK(be->write(a.state, NULL, zero, NULL, a.staging, 0, N));
    CHECK_OK(be->write(a.state, NULL, zero, NULL, a.dst, 0, N));
    for (int i = 0; i < 4; i++) { /* staging [i*512, +100) -> dst [i*1000 + 3, +100) */
        a.table[i] = (mapping_scatter_entry){(uint64_t)i * 512, (uint64_t)i * 1000 + 3, 100};
        memset(expect + i * 1000 + 3, 0x55, 100);
    }
    CHECK_OK(be->write(a.state, NULL, a.table, NULL, a.staging, N, sizeof a.table));
    cuda_device *d = a.state;
    held_fill_on_legacy(&f, d->ctx, cuda_ptr(a.staging), 0x55, N);
    blocking_call c = {scatter_call, &a, 0};
    bool early = run_while_held(&f, &c);
    CHECK_OK(a.st);
    printf("blocking scatter (MAPPING_CUDA_SCATTER=%s) %s while the legacy stream held the fill of its staging\n",
           mode, early ? "finished" : "waited");
    CHECK(!early);
    CHECK_OK(be->read(a.state, NULL, a.dst, 0, back, NULL, N));
    CHECK_BYTES(back, expect, N);
    be->buffer_free(a.state, a.staging);
    be->buffer_free(a.state, a.dst);
    be->device_close(a.state);
}

TEST(cuda_blocking_scatter_is_ordered_after_the_legacy_stream)
{
    open_cuda();
    fake_driver f = fake();
    blocking_scatter_waits_for_the_legacy_stream(f, "auto");
    blocking_scatter_waits_for_the_legacy_stream(f, "batch");
    blocking_scatter_waits_for_the_legacy_stream(f, "copies");
}

static volatile int gate_open;
static void gate(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&gate_open, __ATOMIC_SEQ_CST))
        sleep_ms(1);
}

enum { COPIES = 1000, PIECE = 64, STRIDE = 256, BYTES = COPIES * STRIDE };

TEST(cuda_scatter_kernel_loads_at_open_never_in_a_flush_behind_a_held_stream)
{
    open_cuda();
    fake_driver f = fake();
    setenv("MAPPING_CUDA_SCATTER", "kernel", 1);
    long long loads = f.count("cuModuleLoadData"), func_loads = f.count("cuFuncLoad");
    mapping_device *dev;
    mapping_status st = mapping_open(&(mapping_device_desc){.backend = "cuda"}, &dev);
    unsetenv("MAPPING_CUDA_SCATTER");
    CHECK_OK(st);
    printf("at open: cuModuleLoadData %lld, cuFuncLoad %lld\n", f.count("cuModuleLoadData") - loads,
           f.count("cuFuncLoad") - func_loads);
    CHECK(f.count("cuModuleLoadData") - loads == 1);
    CHECK(f.count("cuFuncLoad") - func_loads == 3); /* the scatter/gather kernel, the mirrors' diff kernel and the graph syncs' table copy */

    unsigned char *host = malloc(BYTES), *all = malloc(BYTES), *expect = calloc(1, BYTES);
    CHECK(host && all && expect);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, BYTES, &buf));
    CHECK_OK(mapping_sync_to_gpu(expect, buf));
    mapping_batch *b;
    CHECK_OK(mapping_batch_create(dev, &b));
    test_pattern(host, BYTES, 3);
    for (int i = 0; i < COPIES; i++) {
        CHECK_OK(mapping_batch_add_to_gpu(b, host + (size_t)i * STRIDE, buf, (size_t)i * STRIDE, PIECE));
        memcpy(expect + (size_t)i * STRIDE, host + (size_t)i * STRIDE, PIECE);
    }
    /* A stream of the caller's, held by a host function until the flush is
     * done: a context-wide synchronize inside the flush would never end. */
    mapping_stream *held;
    CHECK_OK(mapping_stream_create(dev, &held));
    gate_open = 0;
    CHECK_OK(mapping_launch_host(held, gate, NULL));
    long long kernels = f.count("cuLaunchKernel"), lazy = f.count("lazy_loads");
    loads = f.count("cuModuleLoadData");
    CHECK_OK(mapping_batch_flush(NULL, b));
    printf("the flush: cuLaunchKernel %lld, cuModuleLoadData %lld, lazy loads %lld\n",
           f.count("cuLaunchKernel") - kernels, f.count("cuModuleLoadData") - loads, f.count("lazy_loads") - lazy);
    CHECK(f.count("cuLaunchKernel") > kernels); /* the scatter kernel ran */
    CHECK(f.count("cuModuleLoadData") == loads);
    CHECK(f.count("lazy_loads") == lazy);
    __atomic_store_n(&gate_open, 1, __ATOMIC_SEQ_CST);
    CHECK_OK(mapping_stream_synchronize(held));
    CHECK_OK(mapping_sync_to_cpu(buf, all));
    CHECK_BYTES(all, expect, BYTES);
    mapping_stream_destroy(held);
    mapping_batch_destroy(b);
    mapping_free_gpu(buf);
    mapping_close(dev);
    free(host);
    free(all);
    free(expect);
}

TEST(cuda_link_is_measured_at_open_on_a_private_stream)
{
    open_cuda();
    fake_driver f = fake();
    mapping_device *dev;
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = "cuda"}, &dev));
    long long sync_copies = f.count("cuMemcpyHtoD"), legacy_waits = f.count("cuStreamSynchronize_legacy");
    /* The legacy stream holds the user's work: asking for the link must not
     * wait for it (the fake would hold a synchronous copy here forever). */
    f.hold_legacy(1);
    mapping_link link;
    mapping_status st = mapping_device_link(dev, &link);
    f.hold_legacy(0);
    CHECK_OK(st);
    printf("link: %.2f us, %.2f GB/s; synchronous copies %lld, legacy-stream waits %lld\n", link.latency * 1e6,
           link.bandwidth / 1e9, f.count("cuMemcpyHtoD") - sync_copies,
           f.count("cuStreamSynchronize_legacy") - legacy_waits);
    CHECK(link.latency > 0 && link.bandwidth > 0);
    CHECK(f.count("cuMemcpyHtoD") == sync_copies);
    CHECK(f.count("cuStreamSynchronize_legacy") == legacy_waits);
    mapping_close(dev);
}
