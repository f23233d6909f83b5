/* Mirrors: what a sync moves, merging by the link, async-correct state (the
 * checks that read the state itself: tests/internal/mirror_sync_state.c). */
#include "harness.h"

static void set_link(mapping_device *dev, double latency, double bandwidth)
{
    mapping_link link = {latency, bandwidth};
    CHECK_OK(mapping_device_set_link(dev, &link));
}

TEST(new_mirror_is_valid_on_cpu_and_stale_on_gpu)
{
    mapping_device *dev = test_device();
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, 5000, 0, &m));
    CHECK(mapping_mirror_size(m) == 5000);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 5000);
    unsigned char zero[5000] = {0};
    CHECK_BYTES(mapping_mirror_cpu(m), zero, sizeof zero);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
}

TEST(sync_of_clean_mirror_moves_nothing)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 1 << 16, 0, 1);
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    mapping_stats after = test_stats(dev);
    CHECK(after.h2d_bytes == before.h2d_bytes && after.d2h_bytes == before.d2h_bytes);
    CHECK(after.h2d_copies == before.h2d_copies && after.d2h_copies == before.d2h_copies);
    CHECK(after.sync_skipped_bytes - before.sync_skipped_bytes == 2u << 16);
    mapping_mirror_destroy(m);
}

TEST(sync_copies_exactly_the_stale_ranges)
{
    mapping_device *dev = test_device();
    set_link(dev, 1e-12, 1e9); /* never merge */
    const size_t n = 1 << 16;
    mapping_mirror *m = test_synced_mirror(dev, n, 0, 2);
    unsigned char *cpu = mapping_mirror_cpu(m);
    memset(cpu + 100, 0xA1, 10);
    memset(cpu + 5000, 0xA2, 300);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 100, 10));
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 5000, 300));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 310);
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_stats after = test_stats(dev);
    CHECK(after.h2d_bytes - before.h2d_bytes == 310);
    CHECK(after.h2d_copies - before.h2d_copies == 2);
    CHECK(after.sync_skipped_bytes - before.sync_skipped_bytes == n - 310);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
}

TEST(neighbouring_stale_ranges_merge_when_the_gap_costs_less_than_a_transfer)
{
    mapping_device *dev = test_device();
    /* 10 us latency at 1 GB/s: a gap under 10,000 bytes is cheaper to copy. */
    set_link(dev, 10e-6, 1e9);
    mapping_mirror *m = test_synced_mirror(dev, 1 << 16, 0, 3);
    unsigned char *cpu = mapping_mirror_cpu(m);
    const size_t starts[] = {0, 1000, 9000, 40000}; /* gaps 936, 7936, 30936 */
    for (int i = 0; i < 4; i++) {
        memset(cpu + starts[i], 0x50 + i, 64);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, starts[i], 64));
    }
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_stats after = test_stats(dev);
    CHECK(after.h2d_copies - before.h2d_copies == 2);           /* [0, 9064) and [40000, 40064) */
    CHECK(after.h2d_bytes - before.h2d_bytes == 9064 + 64);
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
}

TEST(many_stale_ranges_go_through_one_batch_and_merge_only_tiny_gaps)
{
    mapping_device *dev = test_device();
    /* With 10 us at 1 GB/s separate copies would merge gaps under 10,000
     * bytes; in a batch another range costs a table entry, not a transfer. */
    set_link(dev, 10e-6, 1e9);
    enum { RANGES = 100, STRIDE = 1000, TINY = 32 };
    mapping_mirror *m = test_synced_mirror(dev, RANGES * STRIDE + 4096, 0, 5);
    unsigned char *cpu = mapping_mirror_cpu(m);
    for (int i = 0; i < RANGES; i++) {
        memset(cpu + (size_t)i * STRIDE, 0x20 + i, 64);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, (size_t)i * STRIDE, 64));
    }
    /* One pair with a tiny gap: worth merging even in a batch. */
    memset(cpu + 64 + TINY, 0x77, 8);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 64 + TINY, 8));
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_stats after = test_stats(dev);
    CHECK(after.batch_flushes - before.batch_flushes == 1);
    CHECK(after.batch_copies - before.batch_copies == RANGES); /* 101 stale ranges, the tiny gap merged */
    CHECK(after.h2d_copies - before.h2d_copies <= 2);          /* staged: a transfer or two, not 100 */
    test_check_mirror_sides_equal(m);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    mapping_mirror_destroy(m);
}

TEST(merging_never_copies_a_gap_that_is_stale_on_the_source)
{
    mapping_device *dev = test_device();
    set_link(dev, 1.0, 1e9); /* would merge any gap */
    mapping_mirror *m = test_synced_mirror(dev, 4096, 0, 4);
    unsigned char *cpu = mapping_mirror_cpu(m);
    mapping_buffer *gpu = mapping_mirror_gpu(m);
    memset(cpu + 0, 1, 100);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, 100));
    CHECK_OK(mapping_fill_gpu(NULL, gpu, 200, 100, 0x77)); /* the gap's news is on the GPU */
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 200, 100));
    memset(cpu + 400, 2, 100);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 400, 100));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    unsigned char back[100], want[100];
    memset(want, 0x77, sizeof want);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, gpu, 200, back, 100));
    CHECK_BYTES(back, want, 100);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
}

/* The same through a batch (many ranges, gaps under a table entry's worth):
 * a mirror whose CPU side starts stale (adopted, the data on the GPU), then CPU
 * marks with 8-byte gaps between them; the gaps are stale on the CPU and
 * must keep the GPU's bytes. */
TEST(a_batched_sync_never_copies_a_gap_that_is_stale_on_the_source)
{
    enum { SIZE = 8192, RANGES = 40, STRIDE = 24, LEN = 16 };
    mapping_device *dev = test_device();
    mapping_buffer *gpu;
    unsigned char *cpu = malloc(SIZE);
    CHECK(cpu != NULL);
    memset(cpu, 0x11, SIZE); /* stale bytes: never to reach the GPU */
    CHECK_OK(mapping_allocate_gpu(dev, SIZE, &gpu));
    CHECK_OK(mapping_fill_gpu(NULL, gpu, 0, SIZE, 0x77));
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_adopt(dev, cpu, gpu, 0, SIZE, MAPPING_MIRROR_GPU_VALID, &m));
    for (size_t i = 0; i < RANGES; i++) {
        memset(cpu + i * STRIDE, 0x20 + (int)i, LEN);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, i * STRIDE, LEN));
    }
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    unsigned char back[RANGES * STRIDE];
    CHECK_OK(mapping_sync_to_cpu_range(NULL, gpu, 0, back, sizeof back));
    for (size_t i = 0; i < sizeof back; i++) {
        unsigned char want = i % STRIDE < LEN ? (unsigned char)(0x20 + i / STRIDE) : 0x77;
        if (back[i] != want)
            CHECK(!"a byte on the GPU is not the marked one, or a stale gap was copied over the GPU's");
    }
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
    mapping_free_gpu(gpu);
    free(cpu);
}

TEST(one_modified_byte_moves_one_byte)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 1 << 20, 0, 5);
    ((unsigned char *)mapping_mirror_cpu(m))[123457] ^= 0xFF;
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 123457, 1));
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_stats after = test_stats(dev);
    CHECK(after.h2d_bytes - before.h2d_bytes == 1 && after.h2d_copies - before.h2d_copies == 1);
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
}

/* ---- async ---- */

TEST(work_on_another_stream_waits_for_a_queued_copy_of_the_same_range)
{
    mapping_device *dev = test_device();
    mapping_stream *a, *b;
    CHECK_OK(mapping_stream_create(dev, &a));
    CHECK_OK(mapping_stream_create(dev, &b));
    mapping_mirror *m = test_synced_mirror(dev, 4096, 0, 8);
    unsigned char *cpu = mapping_mirror_cpu(m);
    memset(cpu, 0x22, 4096);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, 4096));
    test_gate g = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(a, test_gate_wait, &g));
    CHECK_OK(mapping_mirror_sync_to_gpu(a, m)); /* held back by the gate */
    mapping_buffer *buf;
    CHECK_OK(mapping_mirror_acquire_gpu(b, m, MAPPING_READ | MAPPING_WRITE, &buf));
    CHECK_OK(mapping_fill_gpu(b, buf, 1000, 100, 0x33)); /* must land after a's copy */
    CHECK_OK(mapping_mirror_release_gpu(b, m));
    test_gate_open(&g);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m)); /* waits for b's work */
    unsigned char want[4096];
    memset(want, 0x22, sizeof want);
    memset(want + 1000, 0x33, 100);
    CHECK_BYTES(cpu, want, 4096);
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
    mapping_stream_destroy(a);
    mapping_stream_destroy(b);
}

TEST(a_stream_may_be_destroyed_before_the_mirror_it_synced)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, 1 << 16, 0, &m));
    memset(mapping_mirror_cpu(m), 0x3C, 1 << 16);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, 1 << 16));
    CHECK_OK(mapping_mirror_sync_to_gpu(s, m));
    mapping_stream_destroy(s); /* waits for the copy; the mirror's event outlives the stream */
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    unsigned char back[16];
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), 100, back, sizeof back));
    CHECK(back[0] == 0x3C && back[15] == 0x3C);
    mapping_mirror_destroy(m);
}

TEST(wrapped_memory_syncs_in_place)
{
    mapping_device *dev = test_device();
    unsigned char user[3000];
    test_pattern(user, sizeof user, 11);
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_wrap(dev, user, sizeof user, 0, &m));
    CHECK(mapping_mirror_cpu(m) == user && mapping_mirror_is_unified(m) == 0);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == sizeof user);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    test_check_mirror_sides_equal(m);
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), 10, 5, 0x66));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 10, 5));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK(user[10] == 0x66 && user[14] == 0x66 && user[15] != 0x66);
    mapping_mirror_destroy(m);
}

TEST(mirror_statistics_appear_in_the_device_json)
{
    mapping_device *dev = test_device();
    mapping_device_stats_reset(dev);
    mapping_mirror *m = test_synced_mirror(dev, 1000, 0, 12);
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, 10));
    CHECK_STATUS(mapping_mirror_mark_cpu_modified(m, 5, 10), MAPPING_ERR_CONFLICT);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    mapping_stats s = test_stats(dev);
    CHECK(s.conflicts == 1 && s.d2h_bytes == 10 && s.sync_skipped_bytes == 990);
    char json[2048];
    CHECK_OK(mapping_device_stats_json(dev, json, sizeof json, NULL));
    CHECK(strstr(json, "\"sync_skipped_bytes\":990") && strstr(json, "\"conflicts\":1"));
    mapping_mirror_destroy(m);
}
