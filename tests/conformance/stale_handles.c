/* A freed handle stays refused for good: the library never puts a new
 * object at a freed one's address (malloc would, at once), so a stale
 * pointer is never taken for a newer object of the same kind. Each test
 * first frees FILL objects of the kind, so that the stale one lands where
 * malloc takes the next chunk of its size from (glibc's calloc skips the
 * per-thread cache, which FILL fills), then makes many new objects. */
#include "harness.h"

enum { MANY = 2000, FILL = 16 };

TEST(stale_buffer_handle_is_refused_after_many_new_buffers)
{
    mapping_device *dev = test_device();
    mapping_buffer *stale, *fill[FILL];
    for (int i = 0; i < FILL; i++)
        CHECK_OK(mapping_allocate_gpu(dev, 4096, &fill[i]));
    CHECK_OK(mapping_allocate_gpu(dev, 64, &stale));
    for (int i = 0; i < FILL; i++)
        mapping_free_gpu(fill[i]);
    mapping_free_gpu(stale);
    mapping_buffer **fresh = calloc(MANY, sizeof *fresh);
    CHECK(fresh);
    for (int i = 0; i < MANY; i++) {
        CHECK_OK(mapping_allocate_gpu(dev, 64 + (size_t)i % 3 * 8, &fresh[i]));
        CHECK(fresh[i] != stale);
        if (i % 2) { /* churn: frees between the allocations */
            mapping_free_gpu(fresh[i]);
            fresh[i] = NULL;
        }
    }
    CHECK(mapping_buffer_size(stale) == 0);
    CHECK(mapping_buffer_device(stale) == NULL);
    unsigned char host[64] = {0};
    CHECK_REFUSED(mapping_sync_to_gpu(host, stale), MAPPING_ERR_INVALID_HANDLE);
    mapping_clear_last_error();
    mapping_free_gpu(stale); /* a double free: refused, frees no live buffer */
    CHECK(mapping_last_error() == MAPPING_ERR_INVALID_HANDLE);
    for (int i = 0; i < MANY; i += 2)
        CHECK(mapping_buffer_size(fresh[i]) == 64 + (size_t)i % 3 * 8);
    for (int i = 0; i < MANY; i++)
        mapping_free_gpu(fresh[i]);
    free(fresh);
}

TEST(stale_stream_and_event_handles_are_refused_after_many_new_ones)
{
    mapping_device *dev = test_device();
    mapping_stream *stale_stream, *s, *fill_streams[FILL];
    mapping_event *stale_event, *fill_events[FILL];
    for (int i = 0; i < FILL; i++)
        CHECK_OK(mapping_stream_create(dev, &fill_streams[i]));
    CHECK_OK(mapping_stream_create(dev, &stale_stream));
    for (int i = 0; i < FILL; i++)
        CHECK_OK(mapping_event_record(stale_stream, &fill_events[i]));
    CHECK_OK(mapping_event_record(stale_stream, &stale_event));
    for (int i = 0; i < FILL; i++) {
        mapping_event_destroy(fill_events[i]);
        mapping_stream_destroy(fill_streams[i]);
    }
    mapping_event_destroy(stale_event);
    mapping_stream_destroy(stale_stream);
    CHECK_OK(mapping_stream_create(dev, &s));
    for (int i = 0; i < MANY; i++) {
        mapping_event *ev;
        CHECK_OK(mapping_event_record(s, &ev));
        CHECK(ev != stale_event);
        mapping_event_destroy(ev);
    }
    for (int i = 0; i < 50; i++) { /* streams cost a thread each on some back ends: fewer */
        mapping_stream *t;
        CHECK_OK(mapping_stream_create(dev, &t));
        CHECK(t != stale_stream);
        mapping_stream_destroy(t);
    }
    CHECK_REFUSED(mapping_event_synchronize(stale_event), MAPPING_ERR_INVALID_HANDLE);
    CHECK_REFUSED(mapping_stream_synchronize(stale_stream), MAPPING_ERR_INVALID_HANDLE);
    CHECK_OK(mapping_stream_synchronize(s));
    mapping_stream_destroy(s);
}

TEST(stale_device_handle_is_refused_after_reopening_many_times)
{
    mapping_device *first = test_device(); /* loads the back end: SKIP where absent */
    (void)first;
    mapping_device_desc desc = {.backend = test_backend()};
    mapping_device *stale, *fill[FILL];
    for (int i = 0; i < FILL; i++)
        CHECK_OK(mapping_open(&desc, &fill[i]));
    CHECK_OK(mapping_open(&desc, &stale));
    for (int i = 0; i < FILL; i++)
        mapping_close(fill[i]);
    mapping_close(stale);
    for (int i = 0; i < 20; i++) {
        mapping_device *dev;
        CHECK_OK(mapping_open(&desc, &dev));
        CHECK(dev != stale);
        mapping_close(dev);
    }
    CHECK(strcmp(mapping_backend_name(stale), "") == 0);
    mapping_device_info info;
    CHECK_REFUSED(mapping_device_get_info(stale, &info), MAPPING_ERR_INVALID_HANDLE);
    mapping_buffer *buf = NULL;
    CHECK_REFUSED(mapping_allocate_gpu(stale, 64, &buf), MAPPING_ERR_INVALID_HANDLE);
}

TEST(stale_multimirror_handle_is_refused_after_many_new_ones)
{
    mapping_device *dev = test_device();
    mapping_multimirror *stale;
    CHECK_OK(mapping_multimirror_create(&dev, 1, 256, &stale));
    mapping_multimirror_destroy(stale);
    for (int i = 0; i < 200; i++) {
        mapping_multimirror *m;
        CHECK_OK(mapping_multimirror_create(&dev, 1, 256, &m));
        CHECK(m != stale);
        mapping_multimirror_destroy(m);
    }
    CHECK(mapping_multimirror_size(stale) == 0);
    CHECK_REFUSED(mapping_multimirror_mark_cpu_modified(stale, 0, 8), MAPPING_ERR_INVALID_HANDLE);
}

TEST(stale_mirror_and_batch_handles_are_refused_after_many_new_ones)
{
    mapping_device *dev = test_device();
    mapping_mirror *stale_mirror, *fill_mirrors[FILL];
    mapping_batch *stale_batch, *fill_batches[FILL];
    for (int i = 0; i < FILL; i++) {
        CHECK_OK(mapping_mirror_create(dev, 256, 0, &fill_mirrors[i]));
        CHECK_OK(mapping_batch_create(dev, &fill_batches[i]));
    }
    CHECK_OK(mapping_mirror_create(dev, 256, 0, &stale_mirror));
    CHECK_OK(mapping_batch_create(dev, &stale_batch));
    for (int i = 0; i < FILL; i++) {
        mapping_mirror_destroy(fill_mirrors[i]);
        mapping_batch_destroy(fill_batches[i]);
    }
    mapping_mirror_destroy(stale_mirror);
    mapping_batch_destroy(stale_batch);
    for (int i = 0; i < 500; i++) {
        mapping_mirror *m;
        mapping_batch *b;
        CHECK_OK(mapping_mirror_create(dev, 256, 0, &m));
        CHECK_OK(mapping_batch_create(dev, &b));
        CHECK(m != stale_mirror && b != stale_batch);
        mapping_mirror_destroy(m);
        mapping_batch_destroy(b);
    }
    CHECK(mapping_mirror_size(stale_mirror) == 0);
    CHECK_REFUSED(mapping_mirror_mark_cpu_modified(stale_mirror, 0, 8), MAPPING_ERR_INVALID_HANDLE);
    CHECK_REFUSED(mapping_batch_flush(NULL, stale_batch), MAPPING_ERR_INVALID_HANDLE);
}
