/* The coherence layer's entry point: many ranges of one host array and one
 * buffer (at `base` in it), moved through the batch machinery. */
#include "testing/test_hooks.h"
#include "harness.h"

enum { SIZE = 1 << 16, BASE = 512 };

TEST(transfer_ranges_moves_many_ranges_of_one_array_in_one_transfer_each_way)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, BASE + SIZE, &buf));
    CHECK_OK(mapping_fill_gpu(NULL, buf, 0, BASE + SIZE, 0));
    unsigned char *host = malloc(SIZE), *back = malloc(SIZE), *expect = calloc(1, SIZE), *got = malloc(SIZE);
    test_pattern(host, SIZE, 40);
    enum { N = 200 };
    mapping_range ranges[N];
    for (size_t i = 0; i < N; i++) { /* every other 128-byte block, one of them empty */
        ranges[i] = (mapping_range){i * 256, i * 256 + (i == 7 ? 0 : 128)};
        memcpy(expect + i * 256, host + i * 256, ranges[i].hi - ranges[i].lo);
    }
    mapping_batch *reuse;
    CHECK_OK(mapping_batch_create(dev, &reuse));
    mapping_stats before, after;
    CHECK_OK(mapping_device_stats(dev, &before));
    CHECK_OK(mapping__transfer_ranges(NULL, reuse, true, host, buf, BASE, ranges, N));
    CHECK_OK(mapping_device_stats(dev, &after));
    CHECK(after.h2d_copies - before.h2d_copies == 1);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, BASE, got, SIZE));
    CHECK_BYTES(got, expect, SIZE);

    /* And back, on a stream, into another array, with the temporary batch. */
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    memset(back, 0, SIZE);
    CHECK_OK(mapping_device_stats(dev, &before));
    CHECK_OK(mapping__transfer_ranges(s, NULL, false, back, buf, BASE, ranges, N));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_OK(mapping_device_stats(dev, &after));
    CHECK(after.d2h_copies - before.d2h_copies == 1);
    CHECK_BYTES(back, expect, SIZE);
    mapping_stream_destroy(s);
    mapping_batch_destroy(reuse);
    mapping_free_gpu(buf);
    free(host);
    free(back);
    free(expect);
    free(got);
}

TEST(transfer_ranges_refuses_a_range_past_the_buffer_and_moves_nothing)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 1024, &buf));
    CHECK_OK(mapping_fill_gpu(NULL, buf, 0, 1024, 0x44));
    unsigned char host[2048], got[1024], expect[1024];
    memset(host, 1, sizeof host);
    memset(expect, 0x44, sizeof expect);
    mapping_range ranges[2] = {{0, 64}, {1000, 1064}}; /* the second ends past the buffer */
    CHECK_STATUS(mapping__transfer_ranges(NULL, NULL, true, host, buf, 0, ranges, 2), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_STATUS(mapping__transfer_ranges(NULL, NULL, true, host, buf, 64, ranges, 1), MAPPING_OK);
    CHECK_STATUS(mapping__transfer_ranges(NULL, NULL, true, host, buf, 961, ranges, 1), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_STATUS(mapping__transfer_ranges(NULL, NULL, true, host, buf, 1025, ranges, 0), MAPPING_ERR_OUT_OF_RANGE);
    mapping_range wraps = {SIZE_MAX - 8, SIZE_MAX}, backwards = {64, 0};
    CHECK_STATUS(mapping__transfer_ranges(NULL, NULL, true, host, buf, 16, &wraps, 1), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_STATUS(mapping__transfer_ranges(NULL, NULL, true, host, buf, 0, &backwards, 1), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mapping__transfer_ranges(NULL, NULL, true, NULL, buf, 0, ranges, 1), MAPPING_ERR_NULL_ARGUMENT);
    memset(expect + 64, 1, 64); /* the one call that was in range */
    CHECK_OK(mapping_sync_to_cpu(buf, got));
    CHECK_BYTES(got, expect, sizeof expect);
    mapping_free_gpu(buf);
}

/* The entry point for a list the caller vouches for (a mirror's log): the
 * same bytes as mapping__transfer_ranges, each way. Where assertions are
 * built in (no NDEBUG: the sanitizer builds), a list that breaks the
 * promise (unsorted, past the buffer, or longer than `largest` says) is
 * refused and moves nothing; elsewhere the ranges are not checked. */
TEST(transfer_sorted_ranges_moves_a_vouched_list_and_checks_the_promise_where_assertions_are)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, BASE + SIZE, &buf));
    CHECK_OK(mapping_fill_gpu(NULL, buf, 0, BASE + SIZE, 0));
    unsigned char *host = malloc(SIZE), *back = calloc(1, SIZE), *expect = calloc(1, SIZE), *got = malloc(SIZE);
    test_pattern(host, SIZE, 41);
    enum { N = 100, LEN = 96 };
    mapping_range ranges[N];
    for (size_t i = 0; i < N; i++) {
        ranges[i] = (mapping_range){i * 300 + 5, i * 300 + 5 + LEN};
        memcpy(expect + ranges[i].lo, host + ranges[i].lo, LEN);
    }
    mapping_batch *reuse;
    CHECK_OK(mapping_batch_create(dev, &reuse));
    CHECK_OK(mapping__transfer_sorted_ranges(NULL, reuse, true, host, buf, BASE, ranges, N, LEN));
    CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, BASE, got, SIZE));
    CHECK_BYTES(got, expect, SIZE);
    CHECK_OK(mapping__transfer_sorted_ranges(NULL, reuse, false, back, buf, BASE, ranges, N, LEN));
    CHECK_BYTES(back, expect, SIZE);
#ifndef NDEBUG /* the caller validated its handles and base (once per public call): checked here only */
    CHECK_STATUS(mapping__transfer_sorted_ranges(NULL, reuse, true, NULL, buf, BASE, ranges, N, LEN),
                 MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping__transfer_sorted_ranges(NULL, reuse, true, host, buf, BASE + SIZE + 1, ranges, N, LEN),
                 MAPPING_ERR_OUT_OF_RANGE);
    mapping_range unsorted[2] = {ranges[1], ranges[0]}, past = {SIZE - 8, SIZE + 8};
    CHECK_STATUS(mapping__transfer_sorted_ranges(NULL, reuse, true, host, buf, BASE, unsorted, 2, LEN),
                 MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mapping__transfer_sorted_ranges(NULL, reuse, true, host, buf, BASE, &past, 1, 16),
                 MAPPING_ERR_OUT_OF_RANGE);
    mapping_range large = {0, 1 << 16};
    CHECK_STATUS(mapping__transfer_sorted_ranges(NULL, reuse, true, host, buf, BASE, &large, 1, 64),
                 MAPPING_ERR_INVALID_ARGUMENT); /* longer than largest says */
    CHECK(mapping_batch_count(reuse) == 0);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, BASE, got, SIZE));
    CHECK_BYTES(got, expect, SIZE); /* nothing moved */
    printf("assertions built in: a broken promise was refused\n");
#else
    printf("NDEBUG build: the ranges of a vouched list are not checked (the sanitizer builds check them)\n");
#endif
    mapping_batch_destroy(reuse);
    mapping_free_gpu(buf);
    free(host);
    free(back);
    free(expect);
    free(got);
}
