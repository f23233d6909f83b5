/*
 * OpenCL-specific behaviour, on the first OpenCL device when there is one:
 * native handles run a user kernel on the library's stream, scatter/gather
 * through the back-end table, SVM unified memory, driver errors by name,
 * asynchronous failures reported by stream_synchronize, and host functions
 * that may call the library.
 */
#include <pthread.h>
#include <stdatomic.h>
#include "harness.h"

#ifdef MAPPING_WITH_OPENCL
#include "backend/opencl/opencl_api.h"
#endif
#ifdef MAPPING_OPENCL_HEADERS
#include "backend/opencl/opencl_internal.h"
#include "testing/test_hooks.h"

static mapping_device *open_opencl(void)
{
    mapping_device *dev = NULL;
    mapping_status st = mapping_open(&(mapping_device_desc){.backend = "opencl"}, &dev);
    if (st == MAPPING_ERR_NO_BACKEND || st == MAPPING_ERR_NO_DEVICE)
        test_skip("OpenCL is not available here: %s", mapping_last_error_message());
    CHECK_OK(st);
    return dev;
}

#define CHECK_CL(expr)                                                                                    \
    do {                                                                                                  \
        cl_int e_ = (expr);                                                                               \
        if (e_ != CL_SUCCESS)                                                                             \
            test_fail(__FILE__, __LINE__, "%s returned %s (%d)", #expr, mapping__opencl_error_name(e_), (int)e_);    \
    } while (0)

static void opencl_native_handles_run_a_user_kernel_on_the_library_stream_body(void)
{
    mapping_device *dev = open_opencl();
    mapping_native_device nd;
    CHECK_OK(mapping_device_native(dev, &nd));
    CHECK(nd.context && nd.device && nd.platform && nd.queue);

    static const char *source = "__kernel void affine(__global float *x, float a)\n"
                                "{ size_t i = get_global_id(0); x[i] = x[i] * a + 1.0f; }\n";
    cl_int err = CL_SUCCESS;
    cl_device_id device = nd.device;
    cl_program program = mapping__opencl_driver.clCreateProgramWithSource(nd.context, 1, &source, NULL, &err);
    CHECK_CL(err);
    CHECK_CL(mapping__opencl_driver.clBuildProgram(program, 1, &device, "", NULL, NULL));
    cl_kernel kernel = mapping__opencl_driver.clCreateKernel(program, "affine", &err);
    CHECK_CL(err);

    enum { N = 1000 };
    float in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (float)i;
    mapping_buffer *buf;
    mapping_stream *s;
    CHECK_OK(mapping_allocate_gpu(dev, sizeof in, &buf));
    CHECK_OK(mapping_stream_create(dev, &s));
    void *mem = NULL, *queue = NULL;
    CHECK_OK(mapping_buffer_native(buf, &mem));
    CHECK_OK(mapping_stream_native(s, &queue));
    CHECK(mem != NULL && queue != NULL);

    CHECK_OK(mapping_sync_to_gpu_range(s, in, buf, 0, sizeof in));
    cl_mem m = mem;
    float a = 2.0f;
    size_t global = N;
    CHECK_CL(mapping__opencl_driver.clSetKernelArg(kernel, 0, sizeof m, &m));
    CHECK_CL(mapping__opencl_driver.clSetKernelArg(kernel, 1, sizeof a, &a));
    CHECK_CL(mapping__opencl_driver.clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, out, sizeof out));
    CHECK_OK(mapping_stream_synchronize(s));
    for (int i = 0; i < N; i++)
        CHECK(out[i] == (float)i * 2.0f + 1.0f);

    /* The device's blocking queue is in order with blocking calls, too. */
    CHECK_CL(mapping__opencl_driver.clEnqueueNDRangeKernel(nd.queue, kernel, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK_OK(mapping_sync_to_cpu(buf, out));
    for (int i = 0; i < N; i++)
        CHECK(out[i] == ((float)i * 2.0f + 1.0f) * 2.0f + 1.0f);

    mapping__opencl_driver.clReleaseKernel(kernel);
    mapping__opencl_driver.clReleaseProgram(program);
    mapping_stream_destroy(s);
    mapping_free_gpu(buf);
    mapping_close(dev);
}

/* A staging buffer holding packed data, then the table at an offset that is
 * not 8-aligned (the kernel must not assume it). Entries mix 16-aligned
 * ranges (the wide path) with odd ones. */
enum { STAGING = 8192, TABLE_AT = 5003, TARGET = 16384, ENTRIES = 5 };
static const mapping_scatter_entry entries[ENTRIES] = {
    {0, 0, 64}, {64, 4096, 1000}, {1064, 77, 7}, {1071, 16000, 384}, {1455, 9999, 1},
};

static void run_scatter_gather(mapping_device *dev, mapping_stream *stream)
{
    const mapping_backend *be = dev->be;
    CHECK(be->scatter && be->gather);
    unsigned char staging[STAGING], target[TARGET], expect[TARGET], back[STAGING];
    test_pattern(staging, STAGING, 40);
    memcpy(staging + TABLE_AT, entries, sizeof entries);
    test_pattern(target, TARGET, 41);
    memcpy(expect, target, TARGET);
    for (int i = 0; i < ENTRIES; i++)
        memcpy(expect + entries[i].buffer_offset, staging + entries[i].staging_offset, entries[i].bytes);

    mapping_buffer *st_buf, *dst;
    CHECK_OK(mapping_allocate_gpu(dev, STAGING, &st_buf));
    CHECK_OK(mapping_allocate_gpu(dev, TARGET, &dst));
    CHECK_OK(mapping_sync_to_gpu_range(stream, staging, st_buf, 0, STAGING));
    CHECK_OK(mapping_sync_to_gpu_range(stream, target, dst, 0, TARGET));
    void *s = mapping__stream_state(stream);
    CHECK_OK(be->scatter(dev->state, s, st_buf->mem, TABLE_AT, entries, ENTRIES, dst->mem));
    CHECK_OK(be->scatter(dev->state, s, st_buf->mem, TABLE_AT, entries, 0, dst->mem)); /* nothing to do */
    unsigned char out[TARGET];
    CHECK_OK(mapping_sync_to_cpu_range(stream, dst, 0, out, TARGET));

    /* Gather the same ranges back into a zeroed staging area (table kept). */
    unsigned char cleared[STAGING];
    memset(cleared, 0, STAGING);
    memcpy(cleared + TABLE_AT, entries, sizeof entries);
    CHECK_OK(mapping_sync_to_gpu_range(stream, cleared, st_buf, 0, STAGING));
    CHECK_OK(be->gather(dev->state, s, dst->mem, st_buf->mem, TABLE_AT, entries, ENTRIES));
    CHECK_OK(mapping_sync_to_cpu_range(stream, st_buf, 0, back, STAGING));
    if (stream)
        CHECK_OK(mapping_stream_synchronize(stream));

    CHECK_BYTES(out, expect, TARGET);
    unsigned char expect_back[STAGING];
    memcpy(expect_back, cleared, STAGING);
    for (int i = 0; i < ENTRIES; i++)
        memcpy(expect_back + entries[i].staging_offset, staging + entries[i].staging_offset, entries[i].bytes);
    CHECK_BYTES(back, expect_back, STAGING);
    mapping_free_gpu(st_buf);
    mapping_free_gpu(dst);
}

static void opencl_scatter_and_gather_move_exactly_the_table_entries_body(void)
{
    mapping_device *dev = open_opencl();
    CHECK(dev->info.caps & MAPPING_CAP_DEVICE_KERNELS);
    run_scatter_gather(dev, NULL);
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    run_scatter_gather(dev, s);
    mapping_stream_destroy(s);
    mapping_close(dev);
}

/* Many entries (more than a work-group holds) of mixed sizes, a few large
 * ones among them (shared by many work-items, across work-groups), with the
 * GPU layout (a large entry's work-items interleave) and the CPU one (each
 * copies a slice), whatever the device is. */
static void scatter_gather_mixed_table(mapping_device *dev, bool sliced)
{
    enum { COUNT = 600, TABLE = COUNT * sizeof(mapping_scatter_entry) };
    mapping_scatter_entry *table = malloc(TABLE);
    size_t staged = TABLE, at = 0;
    for (size_t i = 0; i < COUNT; i++) {
        size_t bytes = i == 7 ? 300000 : i == 300 ? 150001 : i == 599 ? 70000 : 1 + (i * 37) % 200;
        at += i % 3; /* buffer ranges at odd offsets, apart or touching */
        table[i] = (mapping_scatter_entry){staged, at, bytes};
        staged += bytes + (i % 2 ? 16 : 0);
        at += bytes;
    }
    size_t target = at + 64;
    unsigned char *staging = malloc(staged), *before = malloc(target), *expect = malloc(target),
                  *got = malloc(staged > target ? staged : target), *cleared = calloc(1, staged);
    test_pattern(staging, staged, 60);
    memcpy(staging, table, TABLE);
    test_pattern(before, target, 61);
    memcpy(expect, before, target);
    for (size_t i = 0; i < COUNT; i++)
        memcpy(expect + table[i].buffer_offset, staging + table[i].staging_offset, table[i].bytes);
    memcpy(cleared, table, TABLE);

    opencl_device *d = dev->state;
    bool was = d->sliced_lanes;
    d->sliced_lanes = sliced;
    mapping_buffer *st_buf, *dst;
    CHECK_OK(mapping_allocate_gpu(dev, staged, &st_buf));
    CHECK_OK(mapping_allocate_gpu(dev, target, &dst));
    CHECK_OK(mapping_sync_to_gpu_range(NULL, staging, st_buf, 0, staged));
    CHECK_OK(mapping_sync_to_gpu_range(NULL, before, dst, 0, target));
    CHECK_OK(dev->be->scatter(dev->state, NULL, st_buf->mem, 0, table, COUNT, dst->mem));
    CHECK_OK(mapping_sync_to_cpu_range(NULL, dst, 0, got, target));
    CHECK_BYTES(got, expect, target);

    /* Back into a staging buffer holding only the table: the gaps stay zero. */
    CHECK_OK(mapping_sync_to_gpu_range(NULL, cleared, st_buf, 0, staged));
    CHECK_OK(dev->be->gather(dev->state, NULL, dst->mem, st_buf->mem, 0, table, COUNT));
    CHECK_OK(mapping_sync_to_cpu_range(NULL, st_buf, 0, got, staged));
    for (size_t i = 0; i < COUNT; i++)
        memcpy(cleared + table[i].staging_offset, staging + table[i].staging_offset, table[i].bytes);
    CHECK_BYTES(got, cleared, staged);
    d->sliced_lanes = was;
    mapping_free_gpu(st_buf);
    mapping_free_gpu(dst);
    free(table);
    free(staging);
    free(before);
    free(expect);
    free(got);
    free(cleared);
}

static void opencl_scatter_and_gather_share_large_entries_among_work_items_body(void)
{
    mapping_device *dev = open_opencl();
    scatter_gather_mixed_table(dev, false);
    scatter_gather_mixed_table(dev, true);
    mapping_close(dev);
}

static void opencl_unified_memory_is_shared_by_cpu_and_device_or_refused_body(void)
{
    mapping_device *dev = open_opencl();
    void *mem = NULL, *host = NULL;
    mapping_status st = dev->be->buffer_alloc_unified(dev->state, 4096, &mem, &host);
    if (!(dev->info.caps & MAPPING_CAP_UNIFIED)) {
        CHECK_STATUS(st, MAPPING_ERR_UNSUPPORTED);
        mapping_close(dev);
        test_skip("the device has no fine-grain buffer SVM (refused as it should be)");
    }
    CHECK_OK(st);
    CHECK(host != NULL);
    unsigned char in[4096], out[4096];
    test_pattern(in, sizeof in, 42);
    memcpy(host, in, sizeof in); /* the CPU writes directly ... */
    CHECK_OK(dev->be->read(dev->state, NULL, mem, 0, out, NULL, sizeof out)); /* ... the device sees it */
    CHECK_BYTES(out, in, sizeof in);
    CHECK_OK(dev->be->fill(dev->state, NULL, mem, 100, 50, 0xAB)); /* the device writes ... */
    for (int i = 100; i < 150; i++)
        CHECK(((unsigned char *)host)[i] == 0xAB); /* ... the CPU sees it */
    CHECK(((unsigned char *)host)[99] == in[99] && ((unsigned char *)host)[150] == in[150]);
    dev->be->buffer_free(dev->state, mem);
    mapping_close(dev);
}

static void opencl_driver_errors_name_the_call_and_the_cl_code_body(void)
{
    mapping_device *dev = open_opencl();
    mapping_buffer *buf = NULL;
    /* Far beyond CL_DEVICE_MAX_MEM_ALLOC_SIZE: clCreateBuffer refuses it. */
    mapping_status st = mapping_allocate_gpu(dev, (size_t)1 << 52, &buf);
    CHECK(st == MAPPING_ERR_OUT_OF_DEVICE_MEMORY || st == MAPPING_ERR_DRIVER);
    CHECK(buf == NULL);
    const char *msg = mapping_last_error_message();
    if (!strstr(msg, "clCreateBuffer") || !strstr(msg, "CL_"))
        test_fail(__FILE__, __LINE__, "message \"%s\" does not name the call and the code", msg);
    void *host = NULL;
    CHECK_STATUS(mapping_allocate_cpu(dev, (size_t)1 << 52, &host), MAPPING_ERR_OUT_OF_HOST_MEMORY);
    CHECK(host == NULL);
    CHECK(strstr(mapping_last_error_message(), "CL_MEM_ALLOC_HOST_PTR") != NULL);
    CHECK(strcmp(mapping__opencl_error_name(CL_INVALID_VALUE), "CL_INVALID_VALUE") == 0);
    CHECK(strcmp(mapping__opencl_error_name(-12345), "CL_UNKNOWN_ERROR") == 0);
    mapping_close(dev);
}

/* PoCL 3.1 aborts when a queued command fails (a user event set to an
 * error status trips pocl_update_event_failed), so a real asynchronous
 * failure cannot be provoked here; this pins down the reporting: the first
 * error recorded for a stream comes out of stream_synchronize once. */
static void opencl_an_asynchronous_error_is_reported_once_by_stream_synchronize_body(void)
{
    mapping_device *dev = open_opencl();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping__opencl_stream_record_error(s->state, MAPPING_ERR_DRIVER, "opencl: first failure");
    mapping__opencl_stream_record_error(s->state, MAPPING_ERR_OUT_OF_DEVICE_MEMORY, "opencl: second failure");
    CHECK_STATUS(mapping_stream_synchronize(s), MAPPING_ERR_DRIVER);
    CHECK(strcmp(mapping_last_error_message(), "opencl: first failure") == 0);
    CHECK_OK(mapping_stream_synchronize(s));
    mapping_stream_destroy(s);
    mapping_close(dev);
}

typedef struct nested_call {
    mapping_buffer *buf;
    unsigned char  *data;
    mapping_status  st;
} nested_call;

static void blocking_sync_from_host_function(void *arg)
{
    nested_call *c = arg;
    c->st = mapping_sync_to_gpu(c->data, c->buf);
}

static void opencl_host_functions_run_on_a_library_thread_and_may_call_the_library_body(void)
{
    mapping_device *dev = open_opencl();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    unsigned char data[512], out[512];
    test_pattern(data, sizeof data, 43);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, sizeof data, &buf));
    nested_call c = {buf, data, MAPPING_ERR_INTERNAL};
    CHECK_OK(mapping_launch_host(s, blocking_sync_from_host_function, &c));
    /* Later work on the stream waits until the host function returned. */
    CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, out, sizeof out));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_OK(c.st);
    CHECK_BYTES(out, data, sizeof out);
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
    mapping_close(dev);
}

/* Several threads at once, each with its own stream, using the shared
 * scatter kernel (whose arguments are shared state) and blocking calls on the
 * device's queue. Run under ThreadSanitizer in CI. */
typedef struct worker_arg {
    mapping_device *dev;
    unsigned        seed;
    int             ok;
} worker_arg;

static void *scatter_worker(void *p)
{
    worker_arg *w = p;
    mapping_device *dev = w->dev;
    enum { N = 4096 };
    unsigned char data[N], out[N], zero[N];
    test_pattern(data, N, w->seed);
    memset(zero, 0, N);
    mapping_scatter_entry table[2] = {{0, 1000, 100}, {100, 3000, 96}};
    mapping_buffer *staging = NULL, *dst = NULL;
    mapping_stream *s = NULL;
    w->ok = mapping_allocate_gpu(dev, N, &staging) == MAPPING_OK && mapping_allocate_gpu(dev, N, &dst) == MAPPING_OK &&
            mapping_stream_create(dev, &s) == MAPPING_OK;
    memcpy(data + 2048, table, sizeof table);
    for (int round = 0; w->ok && round < 20; round++) {
        w->ok = mapping_sync_to_gpu(zero, dst) == MAPPING_OK &&
                mapping_sync_to_gpu_range(s, data, staging, 0, N) == MAPPING_OK &&
                dev->be->scatter(dev->state, s->state, staging->mem, 2048, table, 2, dst->mem) == MAPPING_OK &&
                mapping_sync_to_cpu_range(s, dst, 0, out, N) == MAPPING_OK &&
                mapping_stream_synchronize(s) == MAPPING_OK;
        w->ok = w->ok && memcmp(out + 1000, data, 100) == 0 && memcmp(out + 3000, data + 100, 96) == 0 &&
                out[999] == 0 && out[1100] == 0 && out[2999] == 0 && out[3096] == 0;
    }
    mapping_stream_destroy(s);
    mapping_free_gpu(staging);
    mapping_free_gpu(dst);
    return NULL;
}

static void opencl_threads_share_a_device_and_its_scatter_kernel_body(void)
{
    mapping_device *dev = open_opencl();
    enum { THREADS = 4 };
    pthread_t threads[THREADS];
    worker_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (worker_arg){dev, 50u + (unsigned)i, 0};
        CHECK(pthread_create(&threads[i], NULL, scatter_worker, &args[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        CHECK(args[i].ok);
    }
    mapping_close(dev);
}
#endif

/* The tests, present in every build (CTest lists them from this file);
 * without the OpenCL back end each one is skipped. */
#ifdef MAPPING_OPENCL_HEADERS
#define OPENCL_RUN(body) body()
#else
#define OPENCL_RUN(body) test_skip("the OpenCL back end is not compiled into this build (or without its headers)")
#endif

#ifdef MAPPING_OPENCL_HEADERS
/* $MAPPING_OPENCL_DIFF picks the diff kernel's shape at open; auto: a
 * work-item per block on a CPU device, a work-group per block elsewhere. */
static void opencl_diff_kernel_shape_follows_the_device_and_the_variable_body(void)
{
    unsetenv("MAPPING_OPENCL_DIFF");
    mapping_device *dev = open_opencl();
    mapping_device_info info;
    CHECK_OK(mapping_device_get_info(dev, &info));
    opencl_device *d = dev->state;
    CHECK(d->diff_by_groups == (strcmp(info.kind, "cpu") != 0));
    mapping_close(dev);
    setenv("MAPPING_OPENCL_DIFF", "groups", 1);
    dev = open_opencl();
    CHECK(((opencl_device *)dev->state)->diff_by_groups);
    mapping_close(dev);
    setenv("MAPPING_OPENCL_DIFF", "items", 1);
    dev = open_opencl();
    CHECK(!((opencl_device *)dev->state)->diff_by_groups);
    mapping_close(dev);
    setenv("MAPPING_OPENCL_DIFF", "warps", 1);
    dev = NULL;
    CHECK_REFUSED(mapping_open(&(mapping_device_desc){.backend = "opencl"}, &dev), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(dev == NULL && strstr(mapping_last_error_message(), "MAPPING_OPENCL_DIFF") != NULL);
    unsetenv("MAPPING_OPENCL_DIFF");
}
#endif

UNIT_TEST(opencl_native_handles_run_a_user_kernel_on_the_library_stream)
{
    OPENCL_RUN(opencl_native_handles_run_a_user_kernel_on_the_library_stream_body);
}

UNIT_TEST(opencl_diff_kernel_shape_follows_the_device_and_the_variable)
{
    OPENCL_RUN(opencl_diff_kernel_shape_follows_the_device_and_the_variable_body);
}

UNIT_TEST(opencl_scatter_and_gather_move_exactly_the_table_entries)
{
    OPENCL_RUN(opencl_scatter_and_gather_move_exactly_the_table_entries_body);
}

UNIT_TEST(opencl_scatter_and_gather_share_large_entries_among_work_items)
{
    OPENCL_RUN(opencl_scatter_and_gather_share_large_entries_among_work_items_body);
}

UNIT_TEST(opencl_unified_memory_is_shared_by_cpu_and_device_or_refused)
{
    OPENCL_RUN(opencl_unified_memory_is_shared_by_cpu_and_device_or_refused_body);
}

UNIT_TEST(opencl_driver_errors_name_the_call_and_the_cl_code)
{
    OPENCL_RUN(opencl_driver_errors_name_the_call_and_the_cl_code_body);
}

UNIT_TEST(opencl_an_asynchronous_error_is_reported_once_by_stream_synchronize)
{
    OPENCL_RUN(opencl_an_asynchronous_error_is_reported_once_by_stream_synchronize_body);
}

UNIT_TEST(opencl_host_functions_run_on_a_library_thread_and_may_call_the_library)
{
    OPENCL_RUN(opencl_host_functions_run_on_a_library_thread_and_may_call_the_library_body);
}

UNIT_TEST(opencl_threads_share_a_device_and_its_scatter_kernel)
{
    OPENCL_RUN(opencl_threads_share_a_device_and_its_scatter_kernel_body);
}

/* ---- a failed wait before a host function (issue 10) ---- */
#ifdef MAPPING_OPENCL_HEADERS
/* clWaitForEvents failing at once on the stream's host-function thread
 * while armed, as a driver's does when the work before the marker failed:
 * the function behind it must not run against unfinished data. */
static cl_int (*real_wait)(cl_uint, const cl_event *);
static pthread_t main_thread;
static _Atomic int wait_failures_armed;

static cl_int failing_wait(cl_uint n, const cl_event *events)
{
    if (!pthread_equal(pthread_self(), main_thread) && atomic_load(&wait_failures_armed) > 0) {
        atomic_fetch_sub(&wait_failures_armed, 1);
        return CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST;
    }
    return real_wait(n, events);
}

static void opencl_a_failed_wait_skips_the_host_function_and_fails_the_stream_body(void)
{
    mapping_device *dev = open_opencl();
    enum { COPIES = 500, SIZE = 64, STRIDE = 128, HALF = COPIES * STRIDE, SENTINEL = 0xEE };
    static unsigned char pattern[2 * HALF], out1[COPIES * SIZE], out2[COPIES * SIZE], sentinel[COPIES * SIZE];
    mapping_stream *s;
    mapping_buffer *buf;
    mapping_batch *b;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_allocate_gpu(dev, sizeof pattern, &buf));
    CHECK_OK(mapping_batch_create(dev, &b));
    test_pattern(pattern, sizeof pattern, 3);
    CHECK_OK(mapping_sync_to_gpu(pattern, buf));
    memset(sentinel, SENTINEL, sizeof sentinel);
    memcpy(out2, sentinel, sizeof out2);
    /* Flush 1 (device-to-host, staged) from the first half: completes. */
    for (int i = 0; i < COPIES; i++)
        CHECK_OK(mapping_batch_add_to_cpu(b, buf, (size_t)i * STRIDE, out1 + i * SIZE, SIZE));
    CHECK_OK(mapping_batch_flush(s, b));
    CHECK_OK(mapping_stream_synchronize(s));

    /* Flush 2 from the second half, with the wait before its unpacking
     * function failing at once: run anyway, that function would copy
     * flush 1's staged bytes into out2. */
    real_wait = mapping__opencl_driver.clWaitForEvents;
    main_thread = pthread_self();
    atomic_store(&wait_failures_armed, 1);
    mapping__opencl_driver.clWaitForEvents = failing_wait;
    for (int i = 0; i < COPIES; i++)
        CHECK_OK(mapping_batch_add_to_cpu(b, buf, HALF + (size_t)i * STRIDE, out2 + i * SIZE, SIZE));
    mapping_status flushed = mapping_batch_flush(s, b);
    mapping_status synced = mapping_stream_synchronize(s);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", mapping_last_error_message());
    mapping__opencl_driver.clWaitForEvents = real_wait;
    CHECK(atomic_load(&wait_failures_armed) == 0); /* the fault happened */
    CHECK_BYTES(out2, sentinel, sizeof out2); /* untouched */
    CHECK_OK(flushed); /* queued: the failure shows at synchronize */
    CHECK_STATUS(synced, MAPPING_ERR_DRIVER);
    if (!strstr(msg, "clWaitForEvents"))
        test_fail(__FILE__, __LINE__, "message \"%s\" does not name clWaitForEvents", msg);
    CHECK_STATUS(mapping_stream_synchronize(s), MAPPING_ERR_DRIVER); /* the stream stays failed */
    mapping_batch_destroy(b);
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
    mapping_close(dev);
}
#endif

UNIT_TEST(opencl_a_failed_wait_skips_the_host_function_and_fails_the_stream)
{
    OPENCL_RUN(opencl_a_failed_wait_skips_the_host_function_and_fails_the_stream_body);
}
