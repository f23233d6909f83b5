/*
 * Host memory at link speed (issue 38, part 3), on the strict fake driver:
 * - page-locked memory the library did not allocate (torch's pin_memory,
 *   cudaHostAlloc, another library's cudaHostRegister) is copied directly,
 *   with no staging, asked of the driver once per range;
 * - mapping_device_set_host_registration registers large pageable copies in
 *   place, in chunks under the driver's per-call limit, keeps them (least
 *   recently used out first) and stages what cannot be registered.
 */
#include <sys/mman.h>
#include "backend/cuda/fake_api.h"

enum { N = 1 << 20 };

typedef fake_result (*host_alloc_fn)(void **p, size_t bytes, unsigned flags);
typedef fake_result (*host_ptr_fn)(void *p);
typedef fake_result (*host_register_fn)(void *p, size_t bytes, unsigned flags);

/* Copies both ways on a held stream: queued without waiting (a copy of
 * pageable memory into it would wait for the stream) and without staging
 * (no host function of the library's). */
static void check_direct(mapping_device *dev, mapping_stream *s, mapping_buffer *buf, unsigned char *host)
{
    test_pattern(host, N, 3);
    test_gate gate = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &gate));
    long long host_fns = fake_count("cuLaunchHostFunc"), h2d = fake_count("cuMemcpyHtoDAsync"),
              d2h = fake_count("cuMemcpyDtoHAsync");
    CHECK_OK(mapping_sync_to_gpu_range(s, host, buf, 0, N));
    CHECK_OK(mapping_fill_gpu(s, buf, 0, 16, 0xee));
    CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, host, N));
    CHECK(test_gate_passed(&gate) == 0); /* queued, not waited for */
    CHECK(fake_count("cuLaunchHostFunc") == host_fns);
    CHECK(fake_count("cuMemcpyHtoDAsync") == h2d + 1 && fake_count("cuMemcpyDtoHAsync") == d2h + 1);
    test_gate_open(&gate);
    CHECK_OK(mapping_stream_synchronize(s));
    unsigned char want[N];
    test_pattern(want, N, 3);
    memset(want, 0xee, 16);
    CHECK_BYTES(host, want, N);
    (void)dev;
}

TEST(cuda_memory_page_locked_elsewhere_is_copied_directly)
{
    mapping_device *dev = test_device();
    if (strcmp(mapping_backend_name(dev), "cuda") != 0)
        test_skip("for the cuda back end; this is %s", mapping_backend_name(dev));
    fake_lib();
    mapping_stream *s;
    mapping_buffer *buf;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));

    /* As torch.Tensor.pin_memory: cudaHostAlloc in the primary context. */
    void *pinned = NULL;
    fake_push(dev);
    CHECK(FAKE_FN(host_alloc_fn, "cuMemHostAlloc")(&pinned, N, 0) == 0);
    fake_pop();
    check_direct(dev, s, buf, pinned);
    long long asked = fake_count("cuPointerGetAttribute");
    check_direct(dev, s, buf, pinned);
    CHECK(fake_count("cuPointerGetAttribute") == asked); /* the range is cached */

    /* As another library's cudaHostRegister of its own memory. */
    unsigned char *theirs = aligned_alloc(4096, N);
    CHECK(theirs != NULL);
    fake_push(dev);
    CHECK(FAKE_FN(host_register_fn, "cuMemHostRegister_v2")(theirs, N, 0) == 0);
    fake_pop();
    check_direct(dev, s, buf, theirs);

    CHECK_OK(mapping_stream_synchronize(s));
    fake_push(dev);
    CHECK(FAKE_FN(host_ptr_fn, "cuMemHostUnregister")(theirs) == 0);
    CHECK(FAKE_FN(host_ptr_fn, "cuMemFreeHost")(pinned) == 0);
    fake_pop();
    free(theirs);
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
}

/* A copy of `bytes` from host on s, and back, checked. */
static void round_trip(mapping_stream *s, mapping_buffer *buf, unsigned char *host, size_t bytes, unsigned seed)
{
    unsigned char *back = malloc(bytes), *want = malloc(bytes);
    CHECK(back && want);
    test_pattern(want, bytes, seed);
    memcpy(host, want, bytes);
    CHECK_OK(mapping_sync_to_gpu_range(s, host, buf, 0, bytes));
    CHECK_OK(mapping_stream_synchronize(s)); /* a DMA reads host memory when the stream gets there */
    memset(host, 0, bytes);
    CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, host, bytes));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_BYTES(host, want, bytes);
    free(back);
    free(want);
}

UNIT_TEST(cuda_host_registration_registers_large_pageable_copies_in_chunks)
{
    static const char *const env[] = {"FAKE_LIBCUDA_REGISTER_MAX=4194304", NULL}; /* a per-call limit of 4 MiB */
    fake_choose("MAPPING_TEST_FAKE_CUDA", env);
    mapping_device *dev = fake_open(0);
    enum { MIB = 1 << 20, BYTES = 8 * MIB };
    CHECK_REFUSED(mapping_device_set_host_registration(dev, 100, MIB), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_device_set_host_registration(dev, 2 * MIB, MIB), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_OK(mapping_device_set_host_registration(dev, MIB, 12 * MIB));
    unsigned char *a = aligned_alloc(2 * MIB, BYTES), *b = aligned_alloc(2 * MIB, BYTES);
    CHECK(a && b);
    mapping_stream *s;
    mapping_buffer *buf;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_allocate_gpu(dev, BYTES, &buf));

    long long host_fns = fake_count("cuLaunchHostFunc");
    round_trip(s, buf, a, BYTES, 1);
    long long registered = fake_count("cuMemHostRegister");
    CHECK(registered >= 2); /* 8 MiB in chunks of at most 4 */
    CHECK(fake_count("largest_host_register") <= 4 * MIB);
    CHECK(fake_count("cuLaunchHostFunc") == host_fns); /* no staging */
    round_trip(s, buf, a, BYTES, 2);
    CHECK(fake_count("cuMemHostRegister") == registered); /* kept */

    long long unregistered = fake_count("cuMemHostUnregister");
    round_trip(s, buf, b, BYTES, 3); /* 16 MiB > 12: a's chunks go, least recently used */
    CHECK(fake_count("cuMemHostUnregister") > unregistered);
    CHECK_OK(mapping_host_registration_forget(dev, b, BYTES));
    CHECK(fake_count("cuMemHostUnregister") >= unregistered + 3);

    /* Read-only memory cannot be registered: staged, and not asked again. */
    unsigned char *ro = mmap(NULL, 2 * MIB, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(ro != MAP_FAILED);
    registered = fake_count("cuMemHostRegister");
    mapping_clear_last_error();
    CHECK_OK(mapping_sync_to_gpu_range(s, ro, buf, 0, 2 * MIB));
    CHECK_OK(mapping_sync_to_gpu_range(s, ro, buf, 0, 2 * MIB));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK(fake_count("cuMemHostRegister") == registered + 1);
    CHECK(mapping_last_error() == MAPPING_OK);

    CHECK_OK(mapping_device_set_host_registration(dev, 0, 0)); /* off: everything unregistered */
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
    mapping_close(dev);
    CHECK(munmap(ro, 2 * MIB) == 0);
    free(a);
    free(b);
}
