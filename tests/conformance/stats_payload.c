/*
 * The payload counters (h2d_payload_bytes, d2h_payload_bytes): what the
 * caller's copies, flushed batches and mirror syncs delivered, beside the
 * driver-transfer counters (h2d_bytes, d2h_bytes), which also count scatter
 * tables, packed staging and merged gaps.
 */
#include "harness.h"

TEST(payload_of_a_plain_copy_equals_its_driver_bytes)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 4096, &buf));
    unsigned char host[4096] = {1};
    mapping_device_stats_reset(dev);
    CHECK_OK(mapping_sync_to_gpu_range(NULL, host, buf, 100, 1000));
    CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, 7, host, 333));
    mapping_stats s = test_stats(dev);
    CHECK(s.h2d_payload_bytes == 1000 && s.h2d_bytes == 1000);
    CHECK(s.d2h_payload_bytes == 333 && s.d2h_bytes == 333);
    /* A refused copy delivers nothing. */
    CHECK_REFUSED(mapping_sync_to_gpu_range(NULL, host, buf, 4000, 1000), MAPPING_ERR_OUT_OF_RANGE);
    CHECK(test_stats(dev).h2d_payload_bytes == 1000);
    mapping_free_gpu(buf);
}

TEST(payload_of_a_batch_is_the_bytes_of_its_copies)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 1 << 16, &buf));
    static unsigned char host[1 << 16];
    mapping_batch *b;
    CHECK_OK(mapping_batch_create(dev, &b));
    mapping_device_stats_reset(dev);
    for (int i = 0; i < 20; i++)
        CHECK_OK(mapping_batch_add_to_gpu(b, host + i * 100, buf, (size_t)i * 1000, 16));
    for (int i = 0; i < 5; i++)
        CHECK_OK(mapping_batch_add_to_cpu(b, buf, 40000 + (size_t)i * 500, host + 30000 + i * 100, 32));
    CHECK_OK(mapping_batch_flush(NULL, b));
    mapping_stats s = test_stats(dev);
    CHECK(s.h2d_payload_bytes == 320 && s.d2h_payload_bytes == 160);
    CHECK(s.h2d_bytes >= 320 && s.d2h_bytes >= 160); /* plus a table where the back end packs */
    /* Cleared copies are not payload. */
    CHECK_OK(mapping_batch_add_to_gpu(b, host, buf, 0, 64));
    mapping_batch_clear(b);
    CHECK_OK(mapping_batch_add_to_gpu(b, host, buf, 0, 8));
    CHECK_OK(mapping_batch_flush(NULL, b));
    CHECK(test_stats(dev).h2d_payload_bytes == 328);
    mapping_batch_destroy(b);
    mapping_free_gpu(buf);
}

TEST(payload_of_a_mirror_sync_is_the_stale_bytes_it_made_valid)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 1 << 16, 0, 3);
    if (mapping_mirror_is_unified(m)) {
        mapping_mirror_destroy(m);
        test_skip("a unified mirror moves nothing");
    }
    unsigned char *cpu = mapping_mirror_cpu(m);
    mapping_device_stats_reset(dev);
    for (int i = 0; i < 20; i++) { /* 20 ranges of 10 bytes, 30 apart: gaps a sync may merge */
        cpu[i * 40] ^= 1;
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, (size_t)i * 40, 10));
    }
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_stats s = test_stats(dev);
    CHECK(s.h2d_payload_bytes == 200);
    CHECK(s.h2d_bytes >= 200);
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 5000, 300));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 9000, 7));
    mapping_stream *st;
    CHECK_OK(mapping_stream_create(dev, &st));
    CHECK_OK(mapping_mirror_sync_to_cpu(st, m));
    CHECK_OK(mapping_stream_synchronize(st));
    s = test_stats(dev);
    CHECK(s.d2h_payload_bytes == 307 && s.d2h_bytes >= 307);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* clean: no payload */
    CHECK(test_stats(dev).h2d_payload_bytes == 200);
    test_check_mirror_sides_equal(m);
    mapping_stream_destroy(st);
    mapping_mirror_destroy(m);
}
