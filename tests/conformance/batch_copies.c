/* Batches: what lands where, how many driver transfers it takes, and order. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "harness.h"

enum { SMALL = 64 };

/* A buffer of n bytes holding `fill` everywhere. */
static mapping_buffer *filled_buffer(mapping_device *dev, size_t n, unsigned char fill)
{
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, n, &buf));
    CHECK_OK(mapping_fill_gpu(NULL, buf, 0, n, fill));
    return buf;
}

/* Offsets 0, 3*SMALL, 6*SMALL, ...: scattered, never touching. */
static size_t scattered(size_t i)
{
    return i * 3 * SMALL;
}

TEST(batch_of_scattered_small_copies_lands_every_byte_and_nothing_else)
{
    mapping_device *dev = test_device();
    enum { N = 1000, BYTES = N * 3 * SMALL };
    mapping_buffer *a = filled_buffer(dev, BYTES, 0x11), *b = filled_buffer(dev, BYTES, 0x22);
    unsigned char *src = malloc((size_t)N * SMALL), *expect_a = malloc(BYTES), *expect_b = malloc(BYTES),
                  *got = malloc(BYTES);
    test_pattern(src, (size_t)N * SMALL, 1);
    memset(expect_a, 0x11, BYTES);
    memset(expect_b, 0x22, BYTES);
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    for (size_t i = 0; i < N; i++) { /* alternate buffers, offsets descending: the batch sorts */
        mapping_buffer *to = i % 2 ? a : b;
        size_t off = scattered(N - 1 - i);
        CHECK_OK(mapping_batch_add_to_gpu(batch, src + i * SMALL, to, off, SMALL));
        memcpy((i % 2 ? expect_a : expect_b) + off, src + i * SMALL, SMALL);
    }
    CHECK(mapping_batch_count(batch) == N);
    CHECK_OK(mapping_batch_flush(NULL, batch));
    CHECK(mapping_batch_count(batch) == 0);
    CHECK_OK(mapping_sync_to_cpu(a, got));
    CHECK_BYTES(got, expect_a, BYTES);
    CHECK_OK(mapping_sync_to_cpu(b, got));
    CHECK_BYTES(got, expect_b, BYTES);
    mapping_batch_destroy(batch);
    mapping_free_gpu(a);
    mapping_free_gpu(b);
    free(src);
    free(expect_a);
    free(expect_b);
    free(got);
}

/* A large in-order batch (on a GPU packed and scattered; with
 * MAPPING_BATCH_MAP=0 on a CPU OpenCL device in pieces, the device
 * scattering one while the CPU packs the next; by default there copied
 * through mapped memory) whose copies
 * each overlap the one before, in two buffers, with one device-to-host copy
 * at the end: every byte is the later copy's, at every piece boundary too,
 * and the device-to-host copy sees them. Then the same for device-to-host
 * copies whose host destinations overlap. */
TEST(a_large_batch_of_overlapping_copies_lands_the_later_copy_everywhere)
{
    mapping_device *dev = test_device();
    enum { N = 9001, LEN = 16, STEP = 12, BYTES = N * STEP + LEN, TAIL = 32 << 10 }; /* TAIL: small, kept in the batch's one pass */
    mapping_buffer *a = filled_buffer(dev, BYTES, 0x11), *b = filled_buffer(dev, BYTES, 0x22);
    unsigned char *src = malloc((size_t)N * LEN), *expect_a = malloc(BYTES), *expect_b = malloc(BYTES),
                  *got = malloc(BYTES), *tail = malloc(TAIL);
    CHECK(src && expect_a && expect_b && got && tail);
    test_pattern(src, (size_t)N * LEN, 7);
    memset(expect_a, 0x11, BYTES);
    memset(expect_b, 0x22, BYTES);
    /* The batch's plan order is by buffer handle: adding in that order keeps
     * the batch in order (no sort), as a loop over one array at a time does. */
    mapping_buffer *first = (uintptr_t)a < (uintptr_t)b ? a : b, *second = first == a ? b : a;
    unsigned char *expect_first = first == a ? expect_a : expect_b, *expect_second = first == a ? expect_b : expect_a;
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    for (int round = 0; round < 2; round++) { /* the second flush reuses the staging */
        for (size_t i = 0; i < N; i++) {
            bool one = i < N / 2;
            size_t off = (one ? i : i - N / 2) * STEP;
            CHECK_OK(mapping_batch_add_to_gpu(batch, src + i * LEN, one ? first : second, off, LEN));
            memcpy((one ? expect_first : expect_second) + off, src + i * LEN, LEN);
        }
        CHECK_OK(mapping_batch_add_to_cpu(batch, a, 0, tail, TAIL)); /* after the scatters: sees them */
        CHECK_OK(mapping_batch_flush(NULL, batch));
        CHECK_BYTES(tail, expect_a, TAIL);
        CHECK_OK(mapping_sync_to_cpu(a, got));
        CHECK_BYTES(got, expect_a, BYTES);
        CHECK_OK(mapping_sync_to_cpu(b, got));
        CHECK_BYTES(got, expect_b, BYTES);
        test_pattern(src, (size_t)N * LEN, 8 + round);
    }
    /* Device to host: sources in order, destinations overlapping going
     * backwards; the host bytes end as the later copy's. */
    unsigned char *host = calloc(BYTES, 1), *want = calloc(BYTES, 1);
    CHECK(host && want);
    CHECK_OK(mapping_sync_to_cpu(first, got));
    for (size_t i = 0; i < N; i++) {
        size_t from = i * STEP, to = (N - 1 - i) * STEP;
        CHECK_OK(mapping_batch_add_to_cpu(batch, first, from, host + to, LEN));
        memcpy(want + to, got + from, LEN);
    }
    CHECK_OK(mapping_batch_flush(NULL, batch));
    CHECK_BYTES(host, want, BYTES);
    free(host);
    free(want);
    mapping_batch_destroy(batch);
    mapping_free_gpu(a);
    mapping_free_gpu(b);
    free(src);
    free(expect_a);
    free(expect_b);
    free(got);
    free(tail);
}

TEST(batch_moves_scattered_small_copies_in_one_host_to_device_transfer)
{
    mapping_device *dev = test_device();
    enum { N = 10000 };
    mapping_buffer *buf = filled_buffer(dev, (size_t)N * 3 * SMALL, 0);
    unsigned char *src = malloc((size_t)N * SMALL);
    test_pattern(src, (size_t)N * SMALL, 2);
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    for (size_t i = 0; i < N; i++)
        CHECK_OK(mapping_batch_add_to_gpu(batch, src + i * SMALL, buf, scattered(i), SMALL));
    CHECK_OK(mapping_batch_flush(NULL, batch)); /* the first flush allocates staging */
    for (size_t i = 0; i < N; i++)
        CHECK_OK(mapping_batch_add_to_gpu(batch, src + i * SMALL, buf, scattered(i), SMALL));
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_batch_flush(NULL, batch));
    mapping_stats after = test_stats(dev);
    CHECK(after.h2d_copies - before.h2d_copies == 1);
    CHECK(after.d2h_copies == before.d2h_copies);
    CHECK(after.batch_flushes - before.batch_flushes == 1);
    CHECK(after.batch_copies - before.batch_copies == 0); /* counted when added */
    CHECK(after.batch_copies >= 2 * N);
    mapping_batch_destroy(batch);
    mapping_free_gpu(buf);
    free(src);
}

TEST(batch_moves_scattered_device_to_host_copies_in_one_read)
{
    mapping_device *dev = test_device();
    enum { N = 2000, BYTES = N * 3 * SMALL };
    unsigned char *content = malloc(BYTES), *dst = malloc((size_t)N * SMALL);
    test_pattern(content, BYTES, 3);
    memset(dst, 0, (size_t)N * SMALL);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, BYTES, &buf));
    CHECK_OK(mapping_sync_to_gpu(content, buf));
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    mapping_stats before = test_stats(dev);
    for (size_t i = 0; i < N; i++)
        CHECK_OK(mapping_batch_add_to_cpu(batch, buf, scattered(N - 1 - i), dst + i * SMALL, SMALL));
    CHECK_OK(mapping_batch_flush(NULL, batch));
    mapping_stats after = test_stats(dev);
    CHECK(after.d2h_copies - before.d2h_copies == 1);
    CHECK(after.h2d_copies - before.h2d_copies <= 1); /* at most the gather table */
    for (size_t i = 0; i < N; i++)
        CHECK_BYTES(dst + i * SMALL, content + scattered(N - 1 - i), SMALL);
    mapping_batch_destroy(batch);
    mapping_free_gpu(buf);
    free(content);
    free(dst);
}

TEST(batch_overlapping_host_to_device_copies_the_later_one_wins)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf = filled_buffer(dev, 1024, 0);
    unsigned char one[256], two[256], three[16], expect[1024] = {0}, got[1024];
    memset(one, 1, sizeof one);
    memset(two, 2, sizeof two);
    memset(three, 3, sizeof three);
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    CHECK_OK(mapping_batch_add_to_gpu(batch, one, buf, 100, 256));  /* [100, 356) */
    CHECK_OK(mapping_batch_add_to_gpu(batch, two, buf, 0, 200));    /* [0, 200): wins over one */
    CHECK_OK(mapping_batch_add_to_gpu(batch, three, buf, 150, 16)); /* inside both: wins */
    CHECK_OK(mapping_batch_add_to_gpu(batch, one, buf, 356, 44));   /* touches the first */
    memset(expect + 100, 1, 256);
    memset(expect, 2, 200);
    memset(expect + 150, 3, 16);
    memset(expect + 356, 1, 44);
    CHECK_OK(mapping_batch_flush(NULL, batch));
    CHECK_OK(mapping_sync_to_cpu(buf, got));
    CHECK_BYTES(got, expect, sizeof expect);
    mapping_batch_destroy(batch);
    mapping_free_gpu(buf);
}

/* Copies added out of order into more (direction, buffer) pairs than the
 * plan's radix sort takes (16): the other sort must also keep, for two
 * copies at one offset, the one added later last. Each buffer gets three
 * copies at offset 64 (the last added wins), added round-robin and in
 * reverse buffer order, and one read back of its first copy's bytes. */
TEST(batch_over_many_buffers_the_later_of_two_copies_at_one_offset_wins)
{
    enum { BUFS = 12, SIZE = 256 };
    mapping_device *dev = test_device();
    mapping_buffer *bufs[BUFS];
    unsigned char src[3][BUFS][32], back[BUFS][32], got[SIZE];
    for (int k = 0; k < BUFS; k++) {
        bufs[k] = filled_buffer(dev, SIZE, 0);
        for (int v = 0; v < 3; v++)
            memset(src[v][k], 1 + v + 3 * k, 32);
    }
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    for (int v = 0; v < 3; v++)
        for (int k = BUFS - 1; k >= 0; k--) {
            CHECK_OK(mapping_batch_add_to_gpu(batch, src[v][k], bufs[k], 64, 32));
            if (v == 0) /* device to host too: 24 (direction, buffer) pairs */
                CHECK_OK(mapping_batch_add_to_cpu(batch, bufs[k], 64, back[k], 32));
        }
    CHECK_OK(mapping_batch_flush(NULL, batch));
    for (int k = 0; k < BUFS; k++) {
        CHECK_OK(mapping_sync_to_cpu(bufs[k], got));
        CHECK_BYTES(got + 64, src[2][k], 32); /* the last of the three */
        CHECK_BYTES(back[k], src[2][k], 32);  /* reads come after every write */
        mapping_free_gpu(bufs[k]);
    }
    mapping_batch_destroy(batch);
}

TEST(batch_large_copy_goes_straight_through_unstaged)
{
    mapping_device *dev = test_device();
    const size_t large = (size_t)8 << 20; /* above any threshold (at most 4 MiB) */
    mapping_buffer *buf = filled_buffer(dev, large + 4096, 0);
    unsigned char *src = malloc(large), *got = malloc(large), small[64];
    test_pattern(src, large, 4);
    test_pattern(small, sizeof small, 5);
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    CHECK_OK(mapping_batch_add_to_gpu(batch, small, buf, large + 1024, sizeof small));
    CHECK_OK(mapping_batch_add_to_gpu(batch, src, buf, 0, large));
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_batch_flush(NULL, batch));
    mapping_stats after = test_stats(dev);
    uint64_t transfers = after.h2d_copies - before.h2d_copies;
    /* staging + the large one; one where the CPU copies through mapped device memory */
    CHECK(transfers == 2 || transfers == 1);
    CHECK(after.h2d_bytes - before.h2d_bytes < large + 4096); /* the large one was not staged too */
    CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, 0, got, large));
    CHECK_BYTES(got, src, large);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, large + 1024, got, sizeof small));
    CHECK_BYTES(got, small, sizeof small);
    mapping_batch_destroy(batch);
    mapping_free_gpu(buf);
    free(src);
    free(got);
}

TEST(batch_host_to_device_copies_take_effect_before_device_to_host_ones)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf = filled_buffer(dev, 4096, 0x55);
    unsigned char in[128], out[128];
    test_pattern(in, sizeof in, 6);
    memset(out, 0, sizeof out);
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    CHECK_OK(mapping_batch_add_to_cpu(batch, buf, 1000, out, sizeof out)); /* added first */
    CHECK_OK(mapping_batch_add_to_gpu(batch, in, buf, 1000, sizeof in));
    CHECK_OK(mapping_batch_flush(NULL, batch));
    CHECK_BYTES(out, in, sizeof in);
    mapping_batch_destroy(batch);
    mapping_free_gpu(buf);
}

TEST(batch_flush_on_a_stream_reads_and_writes_host_memory_in_stream_order)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_buffer *a = filled_buffer(dev, 4096, 0), *b = filled_buffer(dev, 4096, 0);
    unsigned char content[256], host[256], out[256];
    test_pattern(content, sizeof content, 7);
    memset(host, 0, sizeof host);
    memset(out, 0, sizeof out);
    CHECK_OK(mapping_sync_to_gpu_range(NULL, content, a, 512, sizeof content));
    /* Earlier work on the stream fills `host`; the batch must read it after. */
    CHECK_OK(mapping_sync_to_cpu_range(s, a, 512, host, sizeof host));
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    for (size_t i = 0; i < sizeof host; i += 32)
        CHECK_OK(mapping_batch_add_to_gpu(batch, host + i, b, 2 * i, 32));
    CHECK_OK(mapping_batch_flush(s, batch));
    for (size_t i = 0; i < sizeof host; i += 32)
        CHECK_OK(mapping_batch_add_to_cpu(batch, b, 2 * i, out + i, 32));
    CHECK_OK(mapping_batch_flush(s, batch)); /* waits for the first flush's staging */
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_BYTES(out, content, sizeof content);
    mapping_batch_destroy(batch);
    mapping_free_gpu(a);
    mapping_free_gpu(b);
    mapping_stream_destroy(s);
}

TEST(batch_flush_of_an_empty_batch_does_nothing)
{
    mapping_device *dev = test_device();
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_batch_flush(NULL, batch));
    mapping_stats after = test_stats(dev);
    CHECK(after.batch_flushes == before.batch_flushes && after.h2d_copies == before.h2d_copies);
    mapping_batch_destroy(batch);
}

TEST(batch_clear_drops_queued_copies_without_moving_them)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf = filled_buffer(dev, 256, 0x33);
    unsigned char src[64], got[256], expect[256];
    memset(src, 9, sizeof src);
    memset(expect, 0x33, sizeof expect);
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    CHECK_OK(mapping_batch_add_to_gpu(batch, src, buf, 0, sizeof src));
    mapping_batch_clear(batch);
    CHECK(mapping_batch_count(batch) == 0);
    CHECK_OK(mapping_batch_flush(NULL, batch));
    CHECK_OK(mapping_sync_to_cpu(buf, got));
    CHECK_BYTES(got, expect, sizeof expect);
    mapping_batch_destroy(batch);
    mapping_free_gpu(buf);
}

TEST(batch_refuses_bad_arguments_and_queues_nothing)
{
    mapping_device *dev = test_device(), *other = test_device2();
    mapping_buffer *buf, *foreign;
    CHECK_OK(mapping_allocate_gpu(dev, 256, &buf));
    CHECK_OK(mapping_allocate_gpu(other, 256, &foreign));
    mapping_stream *foreign_stream;
    CHECK_OK(mapping_stream_create(other, &foreign_stream));
    unsigned char host[256];
    mapping_batch *batch;
    CHECK_STATUS(mapping_batch_create(NULL, &batch), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_batch_create(dev, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_OK(mapping_batch_create(dev, &batch));
    CHECK_STATUS(mapping_batch_add_to_gpu(NULL, host, buf, 0, 1), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_batch_add_to_gpu(batch, NULL, buf, 0, 1), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_batch_add_to_gpu(batch, host, NULL, 0, 1), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_batch_add_to_gpu(batch, host, buf, 0, 0), MAPPING_ERR_ZERO_SIZE);
    CHECK_STATUS(mapping_batch_add_to_gpu(batch, host, buf, 200, 57), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_STATUS(mapping_batch_add_to_gpu(batch, host, buf, SIZE_MAX, 2), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_STATUS(mapping_batch_add_to_gpu(batch, host, foreign, 0, 1), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK_STATUS(mapping_batch_add_to_cpu(batch, buf, 0, NULL, 1), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_batch_add_to_cpu(batch, buf, 1, host, 256), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_STATUS(mapping_batch_add_to_cpu(batch, foreign, 0, host, 1), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK(mapping_batch_count(batch) == 0);
    CHECK_STATUS(mapping_batch_flush(NULL, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_OK(mapping_batch_add_to_gpu(batch, host, buf, 0, 1));
    CHECK_STATUS(mapping_batch_flush(foreign_stream, batch), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK(mapping_batch_count(batch) == 1);
    CHECK(mapping_batch_count(NULL) == 0);
    mapping_batch_destroy(NULL);
    mapping_batch_destroy(batch);
    mapping_stream_destroy(foreign_stream);
    mapping_free_gpu(buf);
    mapping_free_gpu(foreign);
}

TEST(batch_can_take_new_copies_while_its_last_flush_is_still_queued)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_buffer *buf = filled_buffer(dev, 8192, 0);
    unsigned char first[512], second[512], got[8192], expect[8192] = {0};
    test_pattern(first, sizeof first, 8);
    test_pattern(second, sizeof second, 9);
    test_gate g = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &g)); /* holds the stream */
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    for (size_t i = 0; i < sizeof first; i += 64) {
        CHECK_OK(mapping_batch_add_to_gpu(batch, first + i, buf, 2 * i, 64));
        memcpy(expect + 2 * i, first + i, 64);
    }
    CHECK_OK(mapping_batch_flush(s, batch));
    CHECK(mapping_batch_count(batch) == 0);
    /* The flush is still queued behind the gate: new copies do not disturb it. */
    for (size_t i = 0; i < sizeof second; i += 64) {
        CHECK_OK(mapping_batch_add_to_gpu(batch, second + i, buf, 4096 + 2 * i, 64));
        memcpy(expect + 4096 + 2 * i, second + i, 64);
    }
    test_gate_open(&g);
    CHECK_OK(mapping_batch_flush(s, batch));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_OK(mapping_sync_to_cpu(buf, got));
    CHECK_BYTES(got, expect, sizeof expect);
    mapping_batch_destroy(batch);
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
}
