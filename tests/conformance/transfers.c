/* The seed's four functions and the device-side operations, on every back end. */
#include "harness.h"

TEST(sync_round_trip_preserves_every_byte)
{
    mapping_device *dev = test_device();
    const size_t n = 1 << 20;
    unsigned char *in = malloc(n), *out = malloc(n);
    test_pattern(in, n, 1);
    memset(out, 0, n);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, n, &buf));
    CHECK(mapping_buffer_size(buf) == n);
    CHECK(mapping_buffer_device(buf) == dev);
    CHECK_OK(mapping_sync_to_gpu(in, buf));
    CHECK_OK(mapping_sync_to_cpu(buf, out));
    CHECK_BYTES(out, in, n);
    mapping_free_gpu(buf);
    free(in);
    free(out);
}

TEST(range_sync_touches_only_its_range)
{
    mapping_device *dev = test_device();
    enum { N = 4096 };
    unsigned char base[N], patch[100], out[N];
    test_pattern(base, N, 2);
    test_pattern(patch, sizeof patch, 3);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    CHECK_OK(mapping_sync_to_gpu(base, buf));
    CHECK_OK(mapping_sync_to_gpu_range(NULL, patch, buf, 1000, sizeof patch));
    memcpy(base + 1000, patch, sizeof patch);
    CHECK_OK(mapping_sync_to_cpu(buf, out));
    CHECK_BYTES(out, base, N);
    /* Read back a sub-range into the middle of a host array. */
    memset(out, 0xEE, N);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, 990, out + 7, 120));
    CHECK_BYTES(out + 7, base + 990, 120);
    CHECK(out[6] == 0xEE && out[127] == 0xEE);
    mapping_free_gpu(buf);
}

TEST(page_locked_memory_round_trips_and_is_page_aligned)
{
    mapping_device *dev = test_device();
    const size_t n = 3 * 4096 + 17;
    unsigned char *pinned, *back;
    CHECK_OK(mapping_allocate_cpu(dev, n, (void **)&pinned));
    CHECK_OK(mapping_allocate_cpu(dev, n, (void **)&back));
    CHECK(((uintptr_t)pinned & 4095) == 0);
    test_pattern(pinned, n, 4);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, n, &buf));
    CHECK_OK(mapping_sync_to_gpu(pinned, buf));
    CHECK_OK(mapping_sync_to_cpu(buf, back));
    CHECK_BYTES(back, pinned, n);
    /* A copy from the middle of a page-locked block. */
    CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, 5, back + 4099, 1000));
    CHECK_BYTES(back + 4099, pinned + 5, 1000);
    mapping_free_gpu(buf);
    mapping_free_cpu(dev, pinned);
    mapping_free_cpu(dev, back);
    CHECK(mapping_last_error() == MAPPING_OK);
}

TEST(copy_gpu_and_fill_gpu_work_on_device_memory)
{
    mapping_device *dev = test_device();
    enum { N = 10000 };
    unsigned char in[N], out[N], expect[N];
    test_pattern(in, N, 5);
    mapping_buffer *a, *b;
    CHECK_OK(mapping_allocate_gpu(dev, N, &a));
    CHECK_OK(mapping_allocate_gpu(dev, N, &b));
    CHECK_OK(mapping_sync_to_gpu(in, a));
    CHECK_OK(mapping_fill_gpu(NULL, b, 0, N, 0x5A));
    CHECK_OK(mapping_copy_gpu(NULL, a, 100, b, 3000, 2500));
    memset(expect, 0x5A, N);
    memcpy(expect + 3000, in + 100, 2500);
    CHECK_OK(mapping_sync_to_cpu(b, out));
    CHECK_BYTES(out, expect, N);
    /* Within one buffer, non-overlapping ranges. */
    CHECK_OK(mapping_copy_gpu(NULL, b, 3000, b, 0, 1000));
    memcpy(expect, expect + 3000, 1000);
    CHECK_OK(mapping_fill_gpu(NULL, b, 9999, 1, 7));
    expect[9999] = 7;
    CHECK_OK(mapping_sync_to_cpu(b, out));
    CHECK_BYTES(out, expect, N);
    mapping_free_gpu(a);
    mapping_free_gpu(b);
}

TEST(fresh_device_memory_is_not_the_callers_memory)
{
    /* The host back end poisons fresh buffers in tests: whatever a back end
     * returns, a buffer is storage of its own, and a write to host memory
     * after a sync does not reach it. */
    mapping_device *dev = test_device();
    unsigned char in[256], out[256];
    test_pattern(in, sizeof in, 6);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, sizeof in, &buf));
    CHECK_OK(mapping_sync_to_gpu(in, buf));
    unsigned char saved[256];
    memcpy(saved, in, sizeof in);
    memset(in, 0, sizeof in); /* the CPU changes its copy; the GPU's must not follow */
    CHECK_OK(mapping_sync_to_cpu(buf, out));
    CHECK_BYTES(out, saved, sizeof out);
    if (strcmp(mapping_backend_name(dev), "host") == 0) {
        mapping_buffer *fresh;
        CHECK_OK(mapping_allocate_gpu(dev, 64, &fresh));
        CHECK_OK(mapping_sync_to_cpu_range(NULL, fresh, 0, out, 64));
        for (int i = 0; i < 64; i++)
            CHECK(out[i] == 0xCD);
        mapping_free_gpu(fresh);
    }
    mapping_free_gpu(buf);
}
