/*
 * The cuda back end against the strict fake driver (tests/fake/fake_libcuda.c),
 * which counts its calls and can refuse every allocation and free. These
 * tests need the fake's test entry points (fake_cuda_count,
 * fake_cuda_forbid_alloc) and SKIP on a real driver.
 *
 * - No driver allocation or free runs inside a batch flush, a mirror sync, a
 *   pipeline run, a stream synchronize or a staged copy, from their first
 *   use on (small staging comes from regions made at open): on a real driver
 *   a free waits for every stream (an allocation may), and the caller's
 *   stream may be waiting for the caller.
 * - Copies of pageable memory on a stream take no page-locked allocation
 *   after open (the staging arena is made at open).
 * - An illegal address on a stream is reported by its synchronize, breaks the
 *   context as on a GPU, and the device still closes; a new open works.
 * - Closing the last device resets the primary context with nothing left.
 * - Each driver profile's entry points are the ones called.
 * - Pinned wraps of memory already page-locked work (the driver refuses to
 *   register it again: 712).
 * - The staging arena grows once when queued copies outgrow it, then holds.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include "harness.h"
#include "backend/cuda/cuda_kernels_ptx.h"

typedef struct fake_driver {
    long long (*count)(const char *name);
    void (*forbid_alloc)(int on);
    int (*version)(int *v);
    int (*ctx_push)(void *ctx);
    int (*ctx_pop)(void **ctx);
    int (*memset_async)(unsigned long long dst, unsigned char value, size_t bytes, void *stream);
    int (*module_load)(void **module, const void *image);
    int (*get_function)(void **fn, void *module, const char *name);
    int (*launch)(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  unsigned shared, void *stream, void **params, void **extra);
} fake_driver;

/* The driver the library loaded, if it is the fake; else SKIP. */
static fake_driver fake(void)
{
    const char *path = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = path && *path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    fake_driver f = {0};
    if (lib) {
        *(void **)&f.count = dlsym(lib, "fake_cuda_count");
        *(void **)&f.forbid_alloc = dlsym(lib, "fake_cuda_forbid_alloc");
        *(void **)&f.version = dlsym(lib, "cuDriverGetVersion");
        *(void **)&f.ctx_push = dlsym(lib, "cuCtxPushCurrent_v2");
        *(void **)&f.ctx_pop = dlsym(lib, "cuCtxPopCurrent_v2");
        *(void **)&f.memset_async = dlsym(lib, "cuMemsetD8Async");
        *(void **)&f.module_load = dlsym(lib, "cuModuleLoadData");
        *(void **)&f.get_function = dlsym(lib, "cuModuleGetFunction");
        *(void **)&f.launch = dlsym(lib, "cuLaunchKernel");
    }
    if (!f.count || !f.forbid_alloc || !f.version || !f.ctx_push || !f.ctx_pop || !f.memset_async || !f.module_load ||
        !f.get_function || !f.launch)
        test_skip("the loaded libcuda is not tests/fake/fake_libcuda.c (its counters are needed)");
    return f;
}

static mapping_device *open_cuda(void)
{
    mapping_device *dev = test_device();
    if (strcmp(mapping_backend_name(dev), "cuda") != 0)
        test_skip("for the cuda back end; this is %s", mapping_backend_name(dev));
    return dev;
}

/* ---- one round of every path that must not allocate ---- */

enum { N = 64 * 1024, RANGES = 200, SPACING = 256, PIECE = 100 };

typedef struct round_state {
    mapping_device   *dev;
    mapping_stream   *s;
    mapping_buffer   *buf;
    mapping_batch    *batch;
    mapping_mirror   *mirror;
    unsigned char    *mirrored; /* pageable, wrapped by the mirror */
    mapping_pipeline *pipe;
    unsigned char    *host, *back; /* pageable */
} round_state;

static mapping_status copy_step(mapping_stream *stream, const mapping_pipeline_chunk *c, void *user)
{
    (void)user;
    return mapping_copy_gpu(stream, c->input, c->input_offset, c->output, c->output_offset, c->bytes);
}

static void one_round(round_state *r, unsigned seed)
{
    /* A batch of scattered pageable copies, both ways, on a stream and blocking. */
    test_pattern(r->host, N, seed);
    for (int i = 0; i < RANGES; i++)
        CHECK_OK(mapping_batch_add_to_gpu(r->batch, r->host + i * SPACING, r->buf, (size_t)i * SPACING, PIECE));
    CHECK_OK(mapping_batch_flush(r->s, r->batch));
    memset(r->back, 0, N);
    for (int i = 0; i < RANGES; i++)
        CHECK_OK(mapping_batch_add_to_cpu(r->batch, r->buf, (size_t)i * SPACING, r->back + i * SPACING, PIECE));
    CHECK_OK(mapping_batch_flush(r->s, r->batch));
    CHECK_OK(mapping_stream_synchronize(r->s));
    for (int i = 0; i < RANGES; i++)
        CHECK_BYTES(r->back + i * SPACING, r->host + i * SPACING, PIECE);
    for (int i = 0; i < RANGES; i++)
        CHECK_OK(mapping_batch_add_to_gpu(r->batch, r->host + i * SPACING, r->buf, (size_t)i * SPACING, PIECE));
    CHECK_OK(mapping_batch_flush(NULL, r->batch));

    /* Staged pageable copies on a stream. */
    CHECK_OK(mapping_sync_to_gpu_range(r->s, r->host, r->buf, 0, N));
    CHECK_OK(mapping_sync_to_cpu_range(r->s, r->buf, 0, r->back, N));
    CHECK_OK(mapping_stream_synchronize(r->s));
    CHECK_BYTES(r->back, r->host, N);

    /* A mirror of pageable memory, scattered ranges both ways. */
    for (int i = 0; i < RANGES; i++) {
        r->mirrored[i * SPACING] = (unsigned char)(seed + (unsigned)i);
        CHECK_OK(mapping_mirror_mark_cpu_modified(r->mirror, (size_t)i * SPACING, 1));
    }
    CHECK_OK(mapping_mirror_sync_to_gpu(r->s, r->mirror));
    CHECK_OK(mapping_stream_synchronize(r->s));
    for (int i = 0; i < RANGES; i++) {
        r->mirrored[i * SPACING] = 0;
        CHECK_OK(mapping_mirror_mark_gpu_modified(r->mirror, (size_t)i * SPACING, 1));
    }
    CHECK_OK(mapping_mirror_sync_to_cpu(r->s, r->mirror));
    CHECK_OK(mapping_stream_synchronize(r->s));
    for (int i = 0; i < RANGES; i++)
        CHECK(r->mirrored[i * SPACING] == (unsigned char)(seed + (unsigned)i));

    /* A pipeline over pageable arrays. */
    memset(r->back, 0, N);
    CHECK_OK(mapping_pipeline_run(r->pipe, r->host, r->back, N, copy_step, NULL));
    CHECK_BYTES(r->back, r->host, N);
}

TEST(cuda_flush_sync_pipeline_and_stream_synchronize_allocate_and_free_nothing)
{
    mapping_device *dev = open_cuda();
    fake_driver f = fake();
    round_state r = {.dev = dev};
    r.host = malloc(N);
    r.back = malloc(N);
    r.mirrored = calloc(1, N);
    CHECK(r.host && r.back && r.mirrored);
    CHECK_OK(mapping_stream_create(dev, &r.s));
    CHECK_OK(mapping_allocate_gpu(dev, N, &r.buf));
    CHECK_OK(mapping_batch_create(dev, &r.batch));
    CHECK_OK(mapping_mirror_wrap(dev, r.mirrored, N, 0, &r.mirror));
    CHECK_OK(mapping_pipeline_create(dev, &(mapping_pipeline_desc){.chunk_bytes = 8192, .depth = 2}, &r.pipe));
    /* A fixed link, so every round makes the same plans (a measured one
     * varies from run to run, and with it what a flush stages). */
    const mapping_link pcie = {5e-6, 10e9};
    CHECK_OK(mapping_device_set_link(dev, &pcie));

    /* From the first use on: the batches' and the pipeline's staging (small
     * here) come from the regions the back end made at open. */
    long long before = f.count("forbidden");
    f.forbid_alloc(1);
    /* Measuring the link (as a flush does on first use) uses the probe memory
     * kept since open. */
    CHECK_OK(mapping_device_set_link(dev, &(mapping_link){0, 0}));
    mapping_link link;
    CHECK_OK(mapping_device_link(dev, &link));
    CHECK(link.latency > 0 && link.bandwidth > 0);
    CHECK_OK(mapping_device_set_link(dev, &pcie));
    for (unsigned round = 1; round < 4; round++)
        one_round(&r, round);
    f.forbid_alloc(0);
    CHECK(f.count("forbidden") == before);

    mapping_pipeline_destroy(r.pipe);
    mapping_mirror_destroy(r.mirror);
    mapping_batch_destroy(r.batch);
    mapping_free_gpu(r.buf);
    mapping_stream_destroy(r.s);
    free(r.host);
    free(r.back);
    free(r.mirrored);
}

/* A held stream: queued staged copies must neither wait nor allocate. */
TEST(cuda_staged_copies_after_open_take_no_page_locked_allocation)
{
    mapping_device *dev = open_cuda();
    fake_driver f = fake();
    enum { BIG = 256 << 10, COPIES = 2000 };
    unsigned char *host = malloc(BIG), *back = malloc(BIG);
    CHECK(host && back);
    mapping_stream *s, *s2;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_stream_create(dev, &s2));
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, BIG, &buf));
    long long allocs = f.count("cuMemHostAlloc"), frees = f.count("cuMemFreeHost");

    test_gate g = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &g));
    for (int i = 0; i < 100; i++) /* 100 x 64 KiB queued behind the gate */
        CHECK_OK(mapping_sync_to_gpu_range(s, host + (i % 4) * 65536, buf, (size_t)(i % 4) * 65536, 65536));
    test_gate_open(&g);
    CHECK_OK(mapping_stream_synchronize(s));

    mapping_buffer *buf2; /* s2's, so the two streams never share bytes */
    CHECK_OK(mapping_allocate_gpu(dev, BIG, &buf2));
    allocs = f.count("cuMemHostAlloc");
    frees = f.count("cuMemFreeHost");
    for (int i = 0; i < COPIES; i++) {
        size_t bytes = (size_t)1 << (i % 19); /* 1 B to 256 KiB */
        mapping_stream *on = i % 2 ? s : s2;
        mapping_buffer *to = i % 2 ? buf : buf2;
        test_pattern(host, bytes, (unsigned)i);
        CHECK_OK(mapping_sync_to_gpu_range(on, host, to, 0, bytes));
        unsigned char *into = i % 2 ? back : back + BIG / 2; /* each stream its own */
        CHECK_OK(mapping_sync_to_cpu_range(on, to, 0, into, bytes > BIG / 2 ? BIG / 2 : bytes));
        if (i % 50 == 49) {
            CHECK_OK(mapping_stream_synchronize(s));
            CHECK_OK(mapping_stream_synchronize(s2));
        }
        if (i % 2 == 0) {
            CHECK_OK(mapping_stream_synchronize(on));
            CHECK_BYTES(into, host, bytes > BIG / 2 ? BIG / 2 : bytes);
        }
    }
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_OK(mapping_stream_synchronize(s2));
    CHECK(f.count("cuMemHostAlloc") == allocs);
    CHECK(f.count("cuMemFreeHost") == frees);
    mapping_free_gpu(buf);
    mapping_free_gpu(buf2);
    mapping_stream_destroy(s);
    mapping_stream_destroy(s2);
    free(host);
    free(back);
}

TEST(cuda_illegal_address_on_a_stream_is_reported_and_the_device_still_closes)
{
    mapping_device *dev = open_cuda();
    fake_driver f = fake();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 4096, &buf));
    unsigned char host[4096], back[4096];
    test_pattern(host, sizeof host, 3);
    CHECK_OK(mapping_sync_to_gpu(host, buf));
    memset(back, 0xAA, sizeof back);

    /* The caller's own kernel on the library's stream touches a bad address
     * (a copy or memset with one is refused at the call: 1). */
    mapping_native_device native;
    void *native_stream = NULL;
    CHECK_OK(mapping_device_native(dev, &native));
    CHECK_OK(mapping_stream_native(s, &native_stream));
    CHECK(f.ctx_push(native.context) == 0);
    CHECK(f.memset_async(64, 0, 256, native_stream) == 1); /* CUDA_ERROR_INVALID_VALUE, nothing sticks */
    void *module = NULL, *kernel = NULL;
    CHECK(f.module_load(&module, cuda_kernels_ptx) == 0);
    CHECK(f.get_function(&kernel, module, "mapping_copy_entries") == 0);
    unsigned long long staging = 0, table = 64, count = 1, buffer = 0, split = 16 << 10; /* a table at 64 */
    unsigned gather = 0;
    void *params[] = {&staging, &table, &count, &buffer, &gather, &split};
    CHECK(f.launch(kernel, 1, 1, 1, 256, 1, 1, 0, native_stream, params, NULL) == 0); /* fails when it runs */
    void *popped;
    f.ctx_pop(&popped);

    mapping_status read = mapping_sync_to_cpu_range(s, buf, 0, back, sizeof back);
    CHECK(read == MAPPING_OK || read == MAPPING_ERR_DRIVER);
    CHECK_STATUS(mapping_stream_synchronize(s), MAPPING_ERR_DRIVER);
    CHECK(strstr(mapping_last_error_message(), "CUDA_ERROR_ILLEGAL_ADDRESS") != NULL);
    for (size_t i = 0; i < sizeof back; i++) /* the staged read's host function was skipped */
        CHECK(back[i] == 0xAA);
    /* The error is the context's now, as on a GPU. */
    CHECK_STATUS(mapping_sync_to_gpu(host, buf), MAPPING_ERR_DRIVER);

    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
    mapping_close(dev); /* returns: nothing waits for the skipped work */

    /* The last device closed: the primary context reset, a new one works. */
    mapping_device *again;
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = "cuda"}, &again));
    CHECK_OK(mapping_allocate_gpu(again, 4096, &buf));
    CHECK_OK(mapping_sync_to_gpu(host, buf));
    CHECK_OK(mapping_sync_to_cpu(buf, back));
    CHECK_BYTES(back, host, sizeof back);
    mapping_free_gpu(buf);
    mapping_close(again);
    exit(0); /* test_device()'s device is closed: the harness must not use it */
}

TEST(cuda_closing_the_last_device_leaves_the_driver_nothing)
{
    mapping_device *dev = open_cuda(); /* the harness's: not closed here */
    fake_driver f = fake();
    (void)dev;
    long long resets = f.count("context_resets"), leaked = f.count("leaked_at_reset");
    mapping_device *second;
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = "cuda"}, &second));
    round_state r = {.dev = second};
    r.host = malloc(N);
    r.back = malloc(N);
    r.mirrored = calloc(1, N);
    CHECK(r.host && r.back && r.mirrored);
    CHECK_OK(mapping_stream_create(second, &r.s));
    CHECK_OK(mapping_allocate_gpu(second, N, &r.buf));
    CHECK_OK(mapping_batch_create(second, &r.batch));
    CHECK_OK(mapping_mirror_wrap(second, r.mirrored, N, 0, &r.mirror));
    CHECK_OK(mapping_pipeline_create(second, NULL, &r.pipe));
    one_round(&r, 7);
    mapping_pipeline_destroy(r.pipe);
    mapping_mirror_destroy(r.mirror);
    mapping_batch_destroy(r.batch);
    mapping_free_gpu(r.buf);
    mapping_stream_destroy(r.s);
    mapping_close(second);
    CHECK(f.count("context_resets") == resets); /* the harness's device still holds it */
    mapping_close(dev);
    CHECK(f.count("context_resets") == resets + 1);
    CHECK(f.count("leaked_at_reset") == leaked);
    free(r.host);
    free(r.back);
    free(r.mirrored);
    exit(0); /* test_device()'s device is closed */
}

TEST(cuda_calls_the_entry_points_of_the_driver_version_it_finds)
{
    setenv("MAPPING_CUDA_SCATTER", "batch", 1); /* auto scatters by the kernel; this test is about the batch copy */
    mapping_device *dev = open_cuda();
    fake_driver f = fake();
    int version = 0;
    CHECK(f.version(&version) == 0);
    bool v13 = version >= 13000;

    /* A batch of small scattered copies on a stream: scatter by the driver's
     * batch copy (a blocking flush runs on CU_STREAM_LEGACY, which batch
     * copies refuse: it scatters by the kernel). */
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    unsigned char *host = malloc(N);
    CHECK(host != NULL);
    test_pattern(host, N, 5);
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    for (int i = 0; i < RANGES; i++)
        CHECK_OK(mapping_batch_add_to_gpu(batch, host + i * SPACING, buf, (size_t)i * SPACING, 8));
    CHECK_OK(mapping_batch_flush(s, batch));
    CHECK_OK(mapping_stream_synchronize(s));

    /* Timing. */
    mapping_event *a, *b;
    CHECK_OK(mapping_event_record(s, &a));
    CHECK_OK(mapping_fill_gpu(s, buf, 0, N, 1));
    CHECK_OK(mapping_event_record(s, &b));
    CHECK_OK(mapping_stream_synchronize(s));
    double seconds = -1;
    CHECK_OK(mapping_event_elapsed(a, b, &seconds));
    CHECK(seconds >= 0);

    /* A prefetch, through a unified mirror. */
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, 4096, MAPPING_MIRROR_UNIFIED, &m));
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, 4096));
    CHECK_OK(mapping_mirror_sync_to_gpu(s, m));
    CHECK_OK(mapping_stream_synchronize(s));

    const char *batch_new = "cuMemcpyBatchAsync_v2", *batch_old = "cuMemcpyBatchAsync";
    const char *elapsed_new = "cuEventElapsedTime_v2", *elapsed_old = "cuEventElapsedTime";
    const char *prefetch_new = "cuMemPrefetchAsync_v2", *prefetch_old = "cuMemPrefetchAsync";
    CHECK(f.count(v13 ? batch_new : batch_old) > 0);
    CHECK(f.count(v13 ? batch_old : batch_new) == 0);
    CHECK(f.count(v13 ? elapsed_new : elapsed_old) > 0);
    CHECK(f.count(v13 ? elapsed_old : elapsed_new) == 0);
    CHECK(f.count(v13 ? prefetch_new : prefetch_old) > 0);
    CHECK(f.count(v13 ? prefetch_old : prefetch_new) == 0);

    mapping_mirror_destroy(m);
    mapping_event_destroy(a);
    mapping_event_destroy(b);
    mapping_stream_destroy(s);
    mapping_batch_destroy(batch);
    mapping_free_gpu(buf);
    free(host);
}

/* The driver refuses to page-lock memory that overlaps page-locked memory
 * (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED): wrapping such memory with
 * MAPPING_MIRROR_PIN must still give working mirrors. */
TEST(cuda_pinned_wraps_of_memory_already_page_locked_still_work)
{
    mapping_device *dev = open_cuda(); /* any driver: a real one refuses the same */
    enum { BYTES = 3 * 4096 };
    void *locked = NULL;
    CHECK_OK(mapping_allocate_cpu(dev, BYTES, &locked));
    unsigned char *user = malloc(BYTES);
    CHECK(user != NULL);
    mapping_mirror *m[3] = {NULL, NULL, NULL};
    mapping_status st = mapping_mirror_wrap(dev, locked, BYTES, MAPPING_MIRROR_PIN, &m[0]);
    CHECK(st == MAPPING_OK || st == MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_OK(mapping_mirror_wrap(dev, user, BYTES, MAPPING_MIRROR_PIN, &m[1]));
    st = mapping_mirror_wrap(dev, user + 100, 4096, MAPPING_MIRROR_PIN, &m[2]); /* overlaps m[1]'s */
    CHECK(st == MAPPING_OK || st == MAPPING_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 3; i++) {
        if (!m[i])
            continue;
        unsigned char *cpu = mapping_mirror_cpu(m[i]);
        size_t n = mapping_mirror_size(m[i]);
        test_pattern(cpu, n, (unsigned)i + 20);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m[i]));
        memset(cpu, 0, n);
        CHECK_OK(mapping_mirror_mark_gpu_modified(m[i], 0, n));
        CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m[i]));
        unsigned char *expect = malloc(n);
        CHECK(expect != NULL);
        test_pattern(expect, n, (unsigned)i + 20);
        CHECK_BYTES(cpu, expect, n);
        free(expect);
    }
    for (int i = 2; i >= 0; i--)
        mapping_mirror_destroy(m[i]);
    mapping_free_cpu(dev, locked);
    free(user);
}

/* More queued pageable copies than the staging arena holds: it grows (once,
 * by a chunk as large as itself) instead of waiting, and the next round of
 * the same size needs nothing more. The fake is told to let allocations
 * through while the stream is held: the growth is the one allocation a copy
 * may make, and a rare one. */
TEST(cuda_staging_arena_grows_rarely_when_queued_copies_outgrow_it)
{
    setenv("FAKE_LIBCUDA_SYNC_ALLOC", "0", 1); /* read when the fake loads, below */
    mapping_device *dev = open_cuda();
    fake_driver f = fake();
    enum { PIECE = 4 << 20, PIECES = 6 }; /* 24 MiB queued; the arena starts at 16 */
    unsigned char *host = malloc((size_t)PIECE * PIECES), *back = malloc((size_t)PIECE * PIECES);
    CHECK(host && back);
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, (size_t)PIECE * PIECES, &buf));
    long long allocs = f.count("cuMemHostAlloc");
    for (unsigned round = 0; round < 2; round++) {
        test_pattern(host, (size_t)PIECE * PIECES, 30 + round);
        test_gate g = TEST_GATE_INIT;
        CHECK_OK(mapping_launch_host(s, test_gate_wait, &g));
        for (int i = 0; i < PIECES; i++)
            CHECK_OK(mapping_sync_to_gpu_range(s, host + (size_t)i * PIECE, buf, (size_t)i * PIECE, PIECE));
        test_gate_open(&g);
        CHECK_OK(mapping_stream_synchronize(s));
        CHECK_OK(mapping_sync_to_cpu(buf, back));
        CHECK_BYTES(back, host, (size_t)PIECE * PIECES);
        CHECK(f.count("cuMemHostAlloc") == allocs + 1); /* grown in round 0 only */
    }
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
    free(host);
    free(back);
}
