/*
 * The checks of a batch add and of a mirror call once they have passed:
 * the library may skip looking up the batch's device and the buffer again
 * while no handle was removed, so these tests remove handles between calls
 * that already passed, and expect every removal to be seen.
 */
#include "harness.h"

/* Opens a device of the test's back end that the test may close itself. */
static mapping_device *own_device(void)
{
    test_device(); /* SKIP where the back end is absent */
    mapping_device_desc desc = {.backend = test_backend()};
    mapping_device *dev;
    CHECK_OK(mapping_open(&desc, &dev));
    return dev;
}

TEST(batch_add_with_a_buffer_freed_since_it_last_passed_is_refused)
{
    mapping_device *dev = test_device();
    mapping_buffer *x, *y, *z;
    CHECK_OK(mapping_allocate_gpu(dev, 1024, &x));
    CHECK_OK(mapping_allocate_gpu(dev, 1024, &y));
    unsigned char host[64], back[64];
    test_pattern(host, sizeof host, 3);
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    for (int to_gpu = 1; to_gpu >= 0; to_gpu--) {
        /* x passes, then is freed: the same add is refused and queues nothing. */
        if (to_gpu)
            CHECK_OK(mapping_batch_add_to_gpu(batch, host, x, 0, 64));
        else
            CHECK_OK(mapping_batch_add_to_cpu(batch, x, 0, back, 64));
        CHECK_OK(mapping_batch_flush(NULL, batch));
        mapping_free_gpu(x);
        if (to_gpu)
            CHECK_REFUSED(mapping_batch_add_to_gpu(batch, host, x, 0, 64), MAPPING_ERR_INVALID_HANDLE);
        else
            CHECK_REFUSED(mapping_batch_add_to_cpu(batch, x, 0, back, 64), MAPPING_ERR_INVALID_HANDLE);
        CHECK(mapping_batch_count(batch) == 0);
        /* y passes; other handles come and go: y still passes. */
        CHECK_OK(mapping_batch_add_to_gpu(batch, host, y, 64, 64));
        mapping_stream *s;
        CHECK_OK(mapping_stream_create(dev, &s));
        mapping_stream_destroy(s);
        CHECK_OK(mapping_batch_add_to_gpu(batch, host, y, 128, 64));
        CHECK_OK(mapping_allocate_gpu(dev, 1024, &z)); /* another buffer: checked on its own */
        CHECK_OK(mapping_batch_add_to_cpu(batch, z, 0, back, 64));
        CHECK_OK(mapping_batch_flush(NULL, batch));
        CHECK(mapping_batch_count(batch) == 0);
        x = z; /* the next pass frees this one */
    }
    /* y freed while it is the buffer last passed; a new buffer (perhaps at
     * y's address) passes on its own merit, y itself does not. */
    mapping_free_gpu(y);
    mapping_buffer *w;
    CHECK_OK(mapping_allocate_gpu(dev, 512, &w));
    CHECK_REFUSED(mapping_batch_add_to_gpu(batch, host, w, 500, 64), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_OK(mapping_batch_add_to_gpu(batch, host, w, 448, 64));
    if (w != y)
        CHECK_REFUSED(mapping_batch_add_to_gpu(batch, host, y, 0, 64), MAPPING_ERR_INVALID_HANDLE);
    CHECK(mapping_batch_count(batch) == 1);
    CHECK_OK(mapping_batch_flush(NULL, batch));
    CHECK_OK(mapping_sync_to_cpu_range(NULL, w, 448, back, 64));
    CHECK_BYTES(back, host, 64);
    mapping_batch_destroy(batch);
    mapping_free_gpu(w);
    mapping_free_gpu(x);
}

TEST(batch_add_after_its_device_was_closed_is_refused)
{
    mapping_device *dev = own_device();
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 1024, &buf));
    unsigned char host[64] = {0};
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    CHECK_OK(mapping_batch_add_to_gpu(batch, host, buf, 0, 64));
    CHECK_OK(mapping_batch_flush(NULL, batch));
    CHECK_OK(mapping_batch_add_to_gpu(batch, host, buf, 64, 64)); /* passed twice: the fast path */
    mapping_batch_clear(batch);
    mapping_close(dev); /* frees buf too */
    CHECK_REFUSED(mapping_batch_add_to_gpu(batch, host, buf, 0, 64), MAPPING_ERR_INVALID_HANDLE);
    CHECK_REFUSED(mapping_batch_add_to_cpu(batch, buf, 0, host, 64), MAPPING_ERR_INVALID_HANDLE);
    CHECK_REFUSED(mapping_batch_flush(NULL, batch), MAPPING_ERR_INVALID_HANDLE);
    CHECK(mapping_batch_count(batch) == 0);
    mapping_batch_destroy(batch); /* frees its own memory, records the error */
}

TEST(mirror_call_after_its_device_was_closed_is_refused)
{
    mapping_device *dev = own_device();
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, 4096, 0, &m));
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, 64));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* passed: the fast path from here */
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 64, 64));
    mapping_device *other = test_device2(); /* another device's handles come and go meanwhile */
    mapping_buffer *b;
    CHECK_OK(mapping_allocate_gpu(other, 64, &b));
    mapping_free_gpu(b);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 128, 64));
    mapping_close(dev);
    CHECK_REFUSED(mapping_mirror_mark_cpu_modified(m, 0, 64), MAPPING_ERR_INVALID_HANDLE);
    CHECK_REFUSED(mapping_mirror_sync_to_gpu(NULL, m), MAPPING_ERR_INVALID_HANDLE);
    CHECK(mapping_mirror_size(m) == 0);
    mapping_mirror_destroy(m); /* frees its own memory, records the error */
}
