/*
 * The review of the CUDA back end (issue 38): one test per defect found,
 * each failing before its fix, on the strict fake driver.
 * - Imports are checked with the driver: host memory, another device's
 *   memory and a range past the allocation are refused.
 * - A JIT that refuses the kernels fails mapping_open, with its log.
 * - The device's driver line names the scatter mode in use.
 * - Destroying a stream frees no page-locked memory (that waits for every
 *   stream).
 * - The diff kernel is loaded at open where the driver lacks cuFuncLoad.
 * - mapping_device_wait_native orders every stream after a native queue's
 *   work, on the device (the host does not wait).
 * - mapping_event_record reuses pooled CUevents.
 * - A page-locking refused for lack of memory is a host-memory error, and a
 *   pinned wrap that cannot pin leaves no error behind.
 * - mapping_import_stream(dev, NULL) is the legacy stream (CUDA's 0).
 */
#include <unistd.h>
#include "backend/cuda/cuda_kernels_ptx.h"
#include "backend/cuda/fake_api.h"
#include "testing/test_hooks.h"

static mapping_device *open_cuda(void)
{
    mapping_device *dev = test_device();
    if (strcmp(mapping_backend_name(dev), "cuda") != 0)
        test_skip("for the cuda back end; this is %s", mapping_backend_name(dev));
    return dev;
}

static void *native_of(const mapping_buffer *b)
{
    void *p = NULL;
    CHECK_OK(mapping_buffer_native(b, &p));
    return p;
}

UNIT_TEST(cuda_import_refuses_host_memory_other_devices_and_ranges_past_the_allocation)
{
    static const char *const env[] = {"FAKE_LIBCUDA_DEVICES=2", NULL};
    fake_choose("MAPPING_TEST_FAKE_CUDA", env);
    mapping_device *d0 = fake_open(0), *d1 = fake_open(1);
    enum { BIG = 2 << 20 }; /* an allocation of its own (beyond the pools made at open) */
    mapping_buffer *mine, *theirs, *imported = NULL;
    CHECK_OK(mapping_allocate_gpu(d0, BIG, &mine));
    CHECK_OK(mapping_allocate_gpu(d1, BIG, &theirs));
    void *pinned, *pageable = malloc(4096);
    CHECK_OK(mapping_allocate_cpu(d0, 4096, &pinned));

    CHECK_REFUSED(mapping_import_gpu(d0, pinned, 0, 4096, NULL, NULL, &imported), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), "page-locked host memory") != NULL);
    CHECK_REFUSED(mapping_import_gpu(d0, pageable, 0, 4096, NULL, NULL, &imported), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_import_gpu(d0, native_of(theirs), 0, 4096, NULL, NULL, &imported),
                  MAPPING_ERR_DEVICE_MISMATCH);
    CHECK(strstr(mapping_last_error_message(), "CUDA device 1") != NULL);
    CHECK_REFUSED(mapping_import_gpu(d0, native_of(mine), BIG / 2, BIG, NULL, NULL, &imported),
                  MAPPING_ERR_OUT_OF_RANGE);
    CHECK(imported == NULL);
    /* What is right still imports: the other device's memory into its own device. */
    CHECK_OK(mapping_import_gpu(d0, native_of(mine), BIG / 2, BIG / 2, NULL, NULL, &imported));
    mapping_free_gpu(imported);
    CHECK_OK(mapping_import_gpu(d1, native_of(theirs), 0, BIG, NULL, NULL, &imported));
    mapping_free_gpu(imported);

    mapping_free_cpu(d0, pinned);
    free(pageable);
    mapping_free_gpu(mine);
    mapping_free_gpu(theirs);
    mapping_close(d1);
    mapping_close(d0);
}

UNIT_TEST(cuda_jit_refusal_fails_open_with_the_jit_log)
{
    static const char *const env[] = {"FAKE_LIBCUDA_PTX_ISA_MAX=6.2", NULL}; /* the kernels are PTX 6.3 */
    fake_choose("MAPPING_TEST_FAKE_CUDA", env);
    mapping_device *dev = NULL;
    CHECK_REFUSED(mapping_open(&(mapping_device_desc){.backend = "cuda"}, &dev), MAPPING_ERR_DRIVER);
    CHECK(dev == NULL);
    const char *m = mapping_last_error_message();
    CHECK(strstr(m, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION") != NULL);
    CHECK(strstr(m, "JIT log") != NULL && strstr(m, "Unsupported .version 6.3") != NULL);
    CHECK(strstr(m, "MAPPING_CUDA_SCATTER=copies") != NULL);
    /* Without the kernels, the device opens (one copy per entry). */
    CHECK(setenv("MAPPING_CUDA_SCATTER", "copies", 1) == 0);
    dev = fake_open(0);
    mapping_device_info info;
    CHECK_OK(mapping_device_get_info(dev, &info));
    CHECK(strstr(info.driver, "scatter copies") != NULL);
    mapping_close(dev);
}

/* The driver line (mapping info, tests/gpu/run.sh's summary) names the mode. */
UNIT_TEST(cuda_device_info_names_the_scatter_mode_in_use)
{
    fake_choose("MAPPING_TEST_FAKE_CUDA", NULL);
    static const struct {
        const char *setting, *shown;
    } modes[] = {{"", "scatter kernel"}, {"batch", "scatter batch"}, {"kernel", "scatter kernel"},
                 {"copies", "scatter copies"}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        CHECK(setenv("MAPPING_CUDA_SCATTER", modes[i].setting, 1) == 0);
        mapping_device *dev = fake_open(0);
        mapping_device_info info;
        CHECK_OK(mapping_device_get_info(dev, &info));
        if (!strstr(info.driver, modes[i].shown))
            test_fail(__FILE__, __LINE__, "MAPPING_CUDA_SCATTER=%s: the driver line \"%s\" does not say \"%s\"",
                      modes[i].setting, info.driver, modes[i].shown);
        mapping_close(dev);
    }
}

/* The staging arena grows past its high-water mark behind a held stream;
 * a stream's destruction then frees none of it (cuMemFreeHost waits for
 * every stream): only a free of driver memory trims it. */
TEST(cuda_stream_destroy_frees_no_page_locked_memory)
{
    setenv("FAKE_LIBCUDA_SYNC_ALLOC", "0", 1); /* read when the fake loads, below */
    mapping_device *dev = open_cuda();
    fake_lib();
    enum { PIECE = 4 << 20, PIECES = 18 }; /* 72 MiB queued: above the 64 MiB kept */
    unsigned char *host = malloc(PIECE);
    CHECK(host != NULL);
    test_pattern(host, PIECE, 5);
    mapping_stream *s, *other;
    mapping_buffer *buf;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_stream_create(dev, &other));
    CHECK_OK(mapping_allocate_gpu(dev, PIECE, &buf));
    test_gate g = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &g));
    for (int i = 0; i < PIECES; i++)
        CHECK_OK(mapping_sync_to_gpu_range(s, host, buf, 0, PIECE));
    test_gate_open(&g);
    CHECK_OK(mapping_stream_synchronize(s));
    long long frees = fake_count("cuMemFreeHost");
    mapping_stream_destroy(other);
    mapping_stream_destroy(s);
    CHECK(fake_count("cuMemFreeHost") == frees);
    mapping_free_gpu(buf); /* a free of driver memory: the arena is trimmed there */
    CHECK(fake_count("cuMemFreeHost") > frees);
    free(host);
}

/* A CUDA 12.2 driver has no cuFuncLoad: the kernels are loaded at open by a
 * launch over nothing, so no later launch loads one lazily (which may
 * synchronize the context behind a stream the caller holds). */
UNIT_TEST(cuda_diff_kernel_loads_at_open_where_the_driver_lacks_cufuncload)
{
    fake_choose("MAPPING_TEST_FAKE_CUDA_12_2", NULL);
    mapping_device *dev = fake_open(0);
    CHECK(dlsym(fake_lib(), "cuFuncLoad") == NULL);
    long long loads = fake_count("lazy_loads");
    CHECK(loads == 3); /* mapping_copy_entries, mapping_diff_blocks and mapping_copy_table, at open */
    void *module = NULL, *diff = NULL;
    fake_push(dev);
    CHECK(FAKE_FN(fake_result (*)(void **, const void *), "cuModuleLoadData")(&module, cuda_kernels_ptx) == 0);
    CHECK(FAKE_FN(fake_result (*)(void **, void *, const char *), "cuModuleGetFunction")(&diff, module,
                                                                                         "mapping_diff_blocks") == 0);
    unsigned long long nothing = 0, none = 0;
    void *params[] = {&nothing, &nothing, &nothing, &none};
    CHECK(FAKE_FN(fake_result (*)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  void *, void **, void **),
                  "cuLaunchKernel")(diff, 1, 1, 1, 128, 1, 1, 0, NULL, params, NULL) == 0);
    fake_pop();
    CHECK(fake_count("lazy_loads") == loads); /* loaded already */
    mapping_close(dev);
}

/* ---- imports ordered after the producer's queue ---- */

enum { N = 64 * 1024 };

/* Queues on `queue` (a CUstream; NULL: the legacy stream) a host function
 * that holds it, then a memset of buf to 0x77. */
static void producer_writes(mapping_device *dev, void *queue, test_gate *gate, mapping_buffer *buf)
{
    fake_push(dev);
    CHECK(FAKE_FN(fake_result (*)(void *, void (*)(void *), void *), "cuLaunchHostFunc")(queue, test_gate_wait, gate) ==
          0);
    CHECK(FAKE_FN(fake_result (*)(unsigned long long, unsigned char, size_t, void *), "cuMemsetD8Async")(
              (unsigned long long)(uintptr_t)native_of(buf), 0x77, N, queue) == 0);
    fake_pop();
}

static void check_ordered_after(mapping_device *dev, void *queue)
{
    mapping_stream *before, *after;
    mapping_buffer *buf;
    unsigned char *back1, *back2, want[N];
    CHECK_OK(mapping_stream_create(dev, &before));
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    CHECK_OK(mapping_allocate_cpu(dev, N, (void **)&back1));
    CHECK_OK(mapping_allocate_cpu(dev, N, (void **)&back2));
    CHECK_OK(mapping_fill_gpu(NULL, buf, 0, N, 0x11));
    test_gate gate = TEST_GATE_INIT;
    producer_writes(dev, queue, &gate, buf);
    CHECK_OK(mapping_device_wait_native(dev, queue));
    CHECK(test_gate_passed(&gate) == 0); /* the host did not wait for the queue */
    CHECK_OK(mapping_stream_create(dev, &after));
    CHECK_OK(mapping_sync_to_cpu_range(before, buf, 0, back1, N));
    CHECK_OK(mapping_sync_to_cpu_range(after, buf, 0, back2, N));
    usleep(20000);
    CHECK(back1[0] == 0 && back2[0] == 0); /* both wait for the producer */
    test_gate_open(&gate);
    CHECK_OK(mapping_stream_synchronize(before));
    CHECK_OK(mapping_stream_synchronize(after));
    memset(want, 0x77, N);
    CHECK_BYTES(back1, want, N);
    CHECK_BYTES(back2, want, N);
    mapping_free_cpu(dev, back1);
    mapping_free_cpu(dev, back2);
    mapping_free_gpu(buf);
    mapping_stream_destroy(after);
    mapping_stream_destroy(before);
}

/* DLPack: the producer orders its work before the legacy stream, which the
 * library names as its consumer stream. */
TEST(cuda_wait_native_orders_every_stream_after_the_legacy_stream)
{
    mapping_device *dev = open_cuda();
    fake_lib();
    check_ordered_after(dev, NULL);
}

/* __cuda_array_interface__: the producer names its own stream. */
TEST(cuda_wait_native_orders_every_stream_after_a_producers_stream)
{
    mapping_device *dev = open_cuda();
    fake_lib();
    void *producer = NULL;
    fake_push(dev);
    CHECK(FAKE_FN(fake_result (*)(void **, unsigned), "cuStreamCreate")(&producer, 1) == 0);
    fake_pop();
    check_ordered_after(dev, producer);
    fake_push(dev);
    CHECK(FAKE_FN(fake_result (*)(void *), "cuStreamDestroy_v2")(producer) == 0);
    fake_pop();
}

TEST(cuda_event_records_reuse_pooled_events)
{
    mapping_device *dev = open_cuda();
    fake_lib();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    long long created = fake_count("cuEventCreate"), destroyed = fake_count("cuEventDestroy");
    for (int i = 0; i < 100; i++) {
        mapping_event *a, *b;
        double seconds;
        CHECK_OK(mapping_event_record(s, &a));
        CHECK_OK(mapping_event_record(s, &b));
        CHECK_OK(mapping_event_synchronize(b));
        CHECK_OK(mapping_event_elapsed(a, b, &seconds));
        mapping_event_destroy(a);
        mapping_event_destroy(b);
    }
    CHECK(fake_count("cuEventCreate") - created <= 2);
    CHECK(fake_count("cuEventDestroy") == destroyed);
    mapping_stream_destroy(s);
}

/* cuMemHostRegister's CUDA_ERROR_OUT_OF_MEMORY is a locked-memory limit:
 * host memory. A pinned wrap goes on without pinning, and leaves no error. */
UNIT_TEST(cuda_page_locking_refused_for_lack_of_memory_is_a_host_memory_error)
{
    static const char *const env[] = {"FAKE_LIBCUDA_LOCKED_MAX=65536", NULL};
    fake_choose("MAPPING_TEST_FAKE_CUDA", env);
    mapping_device *dev = fake_open(0);
    enum { BIG = 1 << 20 };
    unsigned char *p = aligned_alloc(4096, BIG);
    CHECK(p != NULL);
    void *cookie = NULL;
    CHECK_REFUSED(dev->be->host_register(dev->state, p, BIG, &cookie), MAPPING_ERR_OUT_OF_HOST_MEMORY);
    CHECK(strstr(mapping_last_error_message(), "cuMemHostRegister") != NULL);
    mapping_clear_last_error();
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_wrap(dev, p, BIG, MAPPING_MIRROR_PIN, &m));
    CHECK(mapping_last_error() == MAPPING_OK);
    CHECK(!mapping_mirror_is_pinned(m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_mirror_destroy(m);
    mapping_close(dev);
    free(p);
}

/* torch.cuda.default_stream().cuda_stream is 0: the legacy stream. */
TEST(cuda_import_stream_of_null_is_the_legacy_stream)
{
    mapping_device *dev = open_cuda();
    mapping_stream *legacy;
    CHECK_OK(mapping_import_stream(dev, NULL, &legacy));
    void *native = NULL;
    CHECK_OK(mapping_stream_native(legacy, &native));
    CHECK((uintptr_t)native <= 1); /* 0, or CU_STREAM_LEGACY */
    unsigned char in[4096], out[4096];
    test_pattern(in, sizeof in, 9);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, sizeof in, &buf));
    CHECK_OK(mapping_sync_to_gpu_range(legacy, in, buf, 0, sizeof in));
    CHECK_OK(mapping_sync_to_cpu_range(legacy, buf, 0, out, sizeof out));
    CHECK_OK(mapping_stream_synchronize(legacy));
    CHECK_BYTES(out, in, sizeof in);
    mapping_clear_last_error();
    mapping_stream_destroy(legacy); /* the library's handle only */
    CHECK(mapping_last_error() == MAPPING_OK);
    CHECK_OK(mapping_sync_to_gpu(in, buf));
    mapping_free_gpu(buf);
}
