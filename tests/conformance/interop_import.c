/* Adopting memory and queues made elsewhere: mapping_import_gpu,
 * mapping_import_stream, mapping_mirror_adopt, mapping_open_opencl (its
 * OpenCL-only checks, and the native-queue contract with a real kernel, are
 * in interop_opencl.c; a CUDA runtime pointer in interop_cuda.c). */
#include "harness.h"

typedef struct release_count {
    int   calls;
    void *user_seen;
} release_count;

static void count_release(void *user)
{
    release_count *r = user;
    r->calls++;
    r->user_seen = user;
}

/* An offset every back end accepts for a sub-range (OpenCL sub-buffers need
 * the device's base address alignment, at most a page in practice). */
enum { IMPORT_OFFSET = 4096 };

TEST(import_gpu_uses_memory_made_elsewhere_and_releases_only_its_handle)
{
    mapping_device *dev = test_device();
    const size_t n = 3 * IMPORT_OFFSET;
    mapping_buffer *owner;
    CHECK_OK(mapping_allocate_gpu(dev, n, &owner)); /* stands in for another library's allocation */
    void *native = NULL;
    CHECK_OK(mapping_buffer_native(owner, &native));

    release_count rel = {0, NULL};
    mapping_buffer *whole, *part;
    CHECK_OK(mapping_import_gpu(dev, native, 0, n, count_release, &rel, &whole));
    CHECK_OK(mapping_import_gpu(dev, native, IMPORT_OFFSET, IMPORT_OFFSET, NULL, NULL, &part));
    CHECK(mapping_buffer_size(whole) == n && mapping_buffer_size(part) == IMPORT_OFFSET);
    CHECK(mapping_buffer_device(whole) == dev);

    unsigned char *src = malloc(n), *back = malloc(n);
    test_pattern(src, n, 7);
    CHECK_OK(mapping_sync_to_gpu(src, whole));
    CHECK_OK(mapping_sync_to_cpu(owner, back)); /* the same memory */
    CHECK_BYTES(back, src, n);

    /* The sub-range starts at the offset. */
    CHECK_OK(mapping_fill_gpu(NULL, part, 0, IMPORT_OFFSET, 0x5A));
    CHECK_OK(mapping_sync_to_cpu(whole, back));
    memset(src + IMPORT_OFFSET, 0x5A, IMPORT_OFFSET);
    CHECK_BYTES(back, src, n);

    /* Device copies and a stream. */
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_copy_gpu(s, part, 0, whole, 2 * IMPORT_OFFSET, IMPORT_OFFSET));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_OK(mapping_sync_to_cpu(owner, back));
    memset(src + 2 * IMPORT_OFFSET, 0x5A, IMPORT_OFFSET);
    CHECK_BYTES(back, src, n);

    /* A batch over the imported buffer. */
    mapping_batch *b;
    CHECK_OK(mapping_batch_create(dev, &b));
    unsigned char small[64][16];
    for (int i = 0; i < 64; i++) {
        memset(small[i], i + 1, sizeof small[i]);
        CHECK_OK(mapping_batch_add_to_gpu(b, small[i], whole, (size_t)i * 48, sizeof small[i]));
        memcpy(src + (size_t)i * 48, small[i], sizeof small[i]);
    }
    CHECK_OK(mapping_batch_flush(NULL, b));
    mapping_batch_destroy(b);
    CHECK_OK(mapping_sync_to_cpu(owner, back));
    CHECK_BYTES(back, src, n);

    /* Freeing the imports calls the release callback once and leaves the memory alone. */
    mapping_free_gpu(part);
    CHECK(rel.calls == 0);
    mapping_free_gpu(whole);
    CHECK(rel.calls == 1 && rel.user_seen == &rel);
    memset(back, 0, n);
    CHECK_OK(mapping_sync_to_cpu(owner, back));
    CHECK_BYTES(back, src, n);
    mapping_stream_destroy(s);
    mapping_free_gpu(owner);
    free(src);
    free(back);
}

TEST(import_gpu_left_open_is_released_by_close)
{
    test_device(); /* SKIP where the back end is absent */
    mapping_device *dev;
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = test_backend()}, &dev)); /* closed here */
    mapping_buffer *owner, *imported;
    CHECK_OK(mapping_allocate_gpu(dev, 4096, &owner));
    void *native;
    CHECK_OK(mapping_buffer_native(owner, &native));
    release_count rel = {0, NULL};
    CHECK_OK(mapping_import_gpu(dev, native, 0, 4096, count_release, &rel, &imported));
    mapping_close(dev); /* frees both, the import through its release */
    CHECK(rel.calls == 1);
}

TEST(import_gpu_refuses_bad_input)
{
    mapping_device *dev = test_device();
    mapping_buffer *owner, *out = (mapping_buffer *)1;
    CHECK_OK(mapping_allocate_gpu(dev, 4096, &owner));
    void *native;
    CHECK_OK(mapping_buffer_native(owner, &native));
    CHECK_REFUSED(mapping_import_gpu(NULL, native, 0, 16, NULL, NULL, &out), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_import_gpu(dev, native, 0, 16, NULL, NULL, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_import_gpu(dev, NULL, 0, 16, NULL, NULL, &out), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(out == NULL);
    CHECK_REFUSED(mapping_import_gpu(dev, native, 0, 0, NULL, NULL, &out), MAPPING_ERR_ZERO_SIZE);
    CHECK_REFUSED(mapping_import_gpu(dev, native, SIZE_MAX, 16, NULL, NULL, &out), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_import_gpu((mapping_device *)owner, native, 0, 16, NULL, NULL, &out),
                  MAPPING_ERR_INVALID_HANDLE);
    CHECK(out == NULL);
    mapping_free_gpu(owner);
}

TEST(import_stream_orders_the_librarys_work_on_the_callers_queue)
{
    mapping_device *dev = test_device();
    mapping_stream *owner, *imported = (mapping_stream *)1;
    CHECK_OK(mapping_stream_create(dev, &owner)); /* stands in for another library's queue */
    void *queue = NULL;
    CHECK_OK(mapping_stream_native(owner, &queue));
    if (!queue) {
        CHECK_REFUSED(mapping_import_stream(dev, owner, &imported), MAPPING_ERR_UNSUPPORTED);
        CHECK(imported == NULL);
        mapping_stream_destroy(owner);
        test_skip("back end %s has no native queues to import (checked: it says MAPPING_ERR_UNSUPPORTED)",
                  test_backend());
    }
    CHECK_OK(mapping_import_stream(dev, queue, &imported));
    void *again = NULL;
    CHECK_OK(mapping_stream_native(imported, &again));
    CHECK(again == queue);

    const size_t n = 1 << 20;
    mapping_buffer *a, *b;
    CHECK_OK(mapping_allocate_gpu(dev, n, &a));
    CHECK_OK(mapping_allocate_gpu(dev, n, &b));
    unsigned char *src = malloc(n), *back = malloc(n);
    test_pattern(src, n, 3);
    /* In order on one queue: write, copy, read, all queued before any wait. */
    CHECK_OK(mapping_sync_to_gpu_range(imported, src, a, 0, n));
    CHECK_OK(mapping_copy_gpu(imported, a, 0, b, 0, n));
    CHECK_OK(mapping_sync_to_cpu_range(imported, b, 0, back, n));
    mapping_event *ev;
    CHECK_OK(mapping_event_record(imported, &ev));
    CHECK_OK(mapping_event_synchronize(ev));
    CHECK_BYTES(back, src, n);
    mapping_event_destroy(ev);

    /* Destroying the import leaves the caller's queue working. */
    mapping_stream_destroy(imported);
    memset(back, 0, n);
    CHECK_OK(mapping_sync_to_cpu_range(owner, a, 0, back, n));
    CHECK_OK(mapping_stream_synchronize(owner));
    CHECK_BYTES(back, src, n);
    mapping_stream_destroy(owner);
    mapping_free_gpu(a);
    mapping_free_gpu(b);
    free(src);
    free(back);
}

TEST(import_stream_refuses_bad_input)
{
    mapping_device *dev = test_device();
    mapping_stream *out = (mapping_stream *)1;
    int dummy;
    CHECK_REFUSED(mapping_import_stream(NULL, &dummy, &out), MAPPING_ERR_NULL_ARGUMENT);
    if (strcmp(mapping_backend_name(dev), "cuda") == 0) { /* NULL (0): the legacy stream */
        CHECK_OK(mapping_import_stream(dev, NULL, &out));
        mapping_stream_destroy(out);
        out = (mapping_stream *)1;
        CHECK_OK(mapping_device_wait_native(dev, NULL));
    } else {
        CHECK_REFUSED(mapping_import_stream(dev, NULL, &out), MAPPING_ERR_NULL_ARGUMENT);
        CHECK(out == NULL);
    }
    CHECK_REFUSED(mapping_import_stream(dev, &dummy, NULL), MAPPING_ERR_NULL_ARGUMENT);
}

TEST(mirror_adopt_syncs_between_the_callers_two_sides)
{
    mapping_device *dev = test_device();
    const size_t n = 64 * 1024;
    mapping_buffer *gpu;
    CHECK_OK(mapping_allocate_gpu(dev, n + IMPORT_OFFSET, &gpu));
    CHECK_OK(mapping_fill_gpu(NULL, gpu, 0, n + IMPORT_OFFSET, 0xEE));
    unsigned char *cpu = malloc(n), *back = malloc(n + IMPORT_OFFSET), *expect = malloc(n + IMPORT_OFFSET);
    test_pattern(cpu, n, 11);

    mapping_mirror *m;
    CHECK_OK(mapping_mirror_adopt(dev, cpu, gpu, IMPORT_OFFSET, n, 0, &m));
    CHECK(mapping_mirror_cpu(m) == cpu && mapping_mirror_gpu(m) == gpu);
    CHECK(mapping_mirror_gpu_offset(m) == IMPORT_OFFSET);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == n);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    memset(expect, 0xEE, IMPORT_OFFSET);
    memcpy(expect + IMPORT_OFFSET, cpu, n);
    CHECK_OK(mapping_sync_to_cpu(gpu, back));
    CHECK_BYTES(back, expect, n + IMPORT_OFFSET); /* only the adopted range was written */

    /* Scattered edits: exactly those bytes move (a link that never merges). */
    CHECK_OK(mapping_device_set_link(dev, &(mapping_link){1e-12, 1e9}));
    mapping_stats before = test_stats(dev);
    for (size_t i = 0; i < 100; i++) {
        cpu[i * 600] ^= 0xFF;
        expect[IMPORT_OFFSET + i * 600] ^= 0xFF;
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, i * 600, 1));
    }
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_stats after = test_stats(dev);
    /* Moved: n - skipped (h2d_bytes would also count a batch's table). */
    CHECK(after.sync_skipped_bytes - before.sync_skipped_bytes == n - 100);
    CHECK_OK(mapping_sync_to_cpu(gpu, back));
    CHECK_BYTES(back, expect, n + IMPORT_OFFSET);

    /* The device side changes; a view syncs back only its part. */
    CHECK_OK(mapping_fill_gpu(NULL, gpu, IMPORT_OFFSET + 1000, 500, 0x11));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 1000, 500));
    mapping_mirror *v;
    CHECK_OK(mapping_mirror_view(m, 1000, 500, &v));
    CHECK(mapping_mirror_gpu_offset(v) == IMPORT_OFFSET + 1000);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, v));
    for (size_t i = 1000; i < 1500; i++)
        CHECK(cpu[i] == 0x11);
    mapping_mirror_destroy(v);
    mapping_mirror_destroy(m);

    /* Neither side was freed with the mirror; GPU_VALID starts the other way round. */
    CHECK_OK(mapping_mirror_adopt(dev, cpu, gpu, 0, n, MAPPING_MIRROR_GPU_VALID, &m));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == n);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK_OK(mapping_sync_to_cpu(gpu, back));
    CHECK_BYTES(cpu, back, n);
    mapping_mirror_destroy(m);
    mapping_free_gpu(gpu);
    free(cpu);
    free(back);
    free(expect);
}

TEST(mirror_adopt_over_an_imported_buffer)
{
    mapping_device *dev = test_device();
    const size_t n = 8192;
    mapping_buffer *owner, *imported;
    CHECK_OK(mapping_allocate_gpu(dev, n, &owner));
    void *native;
    CHECK_OK(mapping_buffer_native(owner, &native));
    CHECK_OK(mapping_import_gpu(dev, native, 0, n, NULL, NULL, &imported));
    unsigned char *cpu = malloc(n), *back = malloc(n);
    test_pattern(cpu, n, 5);
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_adopt(dev, cpu, imported, 0, n, MAPPING_MIRROR_PIN, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK_OK(mapping_sync_to_cpu(owner, back));
    CHECK_BYTES(back, cpu, n);
    mapping_mirror_destroy(m);
    mapping_free_gpu(imported);
    mapping_free_gpu(owner);
    free(cpu);
    free(back);
}

TEST(mirror_adopt_refuses_bad_input)
{
    mapping_device *dev = test_device(), *other = test_device2();
    mapping_buffer *gpu, *foreign;
    CHECK_OK(mapping_allocate_gpu(dev, 4096, &gpu));
    CHECK_OK(mapping_allocate_gpu(other, 4096, &foreign));
    unsigned char cpu[4096];
    mapping_mirror *m = (mapping_mirror *)1;
    CHECK_REFUSED(mapping_mirror_adopt(NULL, cpu, gpu, 0, 16, 0, &m), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_mirror_adopt(dev, cpu, gpu, 0, 16, 0, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_mirror_adopt(dev, NULL, gpu, 0, 16, 0, &m), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(m == NULL);
    CHECK_REFUSED(mapping_mirror_adopt(dev, cpu, NULL, 0, 16, 0, &m), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_mirror_adopt(dev, cpu, gpu, 0, 0, 0, &m), MAPPING_ERR_ZERO_SIZE);
    CHECK_REFUSED(mapping_mirror_adopt(dev, cpu, gpu, 4000, 200, 0, &m), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_mirror_adopt(dev, cpu, foreign, 0, 16, 0, &m), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK_REFUSED(mapping_mirror_adopt(dev, cpu, gpu, 0, 16, MAPPING_MIRROR_UNIFIED, &m), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_mirror_adopt(dev, cpu, gpu, 0, 16, 0x80, &m), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(m == NULL);
    mapping_free_gpu(gpu);
    mapping_free_gpu(foreign);
}

TEST(open_opencl_refuses_bad_input)
{
    mapping_device *out = (mapping_device *)1;
    int ctx, devid;
    CHECK_REFUSED(mapping_open_opencl(&ctx, &devid, NULL, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_open_opencl(NULL, &devid, NULL, &out), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(out == NULL);
    CHECK_REFUSED(mapping_open_opencl(&ctx, NULL, NULL, &out), MAPPING_ERR_NULL_ARGUMENT);
}

/* The NULL-stream contract where nothing can be queued outside the library:
 * release_gpu(NULL) and a blocking sync complete at once and stay exact. */
TEST(null_stream_release_then_sync_is_exact_for_both_mirror_kinds)
{
    mapping_device *dev = test_device();
    const unsigned kinds[2] = {0, MAPPING_MIRROR_UNIFIED};
    for (int k = 0; k < 2; k++) {
        const size_t n = 1 << 16;
        mapping_mirror *m = test_synced_mirror(dev, n, kinds[k], 21 + k);
        mapping_buffer *buf;
        CHECK_OK(mapping_mirror_acquire_gpu(NULL, m, MAPPING_WRITE, &buf));
        CHECK_OK(mapping_fill_gpu(NULL, buf, mapping_mirror_gpu_offset(m), n, (unsigned char)(0x30 + k)));
        CHECK_OK(mapping_mirror_release_gpu(NULL, m));
        CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
        const unsigned char *cpu = mapping_mirror_cpu(m);
        for (size_t i = 0; i < n; i++)
            CHECK(cpu[i] == 0x30 + k);
        mapping_mirror_destroy(m);
    }
}
