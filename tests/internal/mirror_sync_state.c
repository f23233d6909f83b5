/* Mirrors: the state behind what a sync moves (range entries, queued copies,
 * page-locked registrations), read through the test hooks
 * (tests/conformance/mirror_sync.c has the rest). */
#include "testing/test_hooks.h"
#include "harness.h"

TEST(marking_many_ranges_keeps_one_entry_per_range)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 1 << 20, 0, 6);
    for (size_t i = 0; i < 1000; i++)
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, i * 1000, 10));
    CHECK(mapping__rs_count(mapping__test_mirror_stale(m, MAPPING_GPU)) == 1000 &&
          mapping__rs_count(mapping__test_mirror_modified(m, MAPPING_CPU)) == 1000);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 10000);
    /* One mark over all of them collapses them into one range. */
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, 1 << 20));
    CHECK(mapping__rs_count(mapping__test_mirror_stale(m, MAPPING_GPU)) == 1 &&
          mapping__rs_memory(mapping__test_mirror_stale(m, MAPPING_GPU)) <= 64 * 1000);
    mapping_mirror_destroy(m);
}

TEST(stream_sync_makes_a_range_valid_only_when_its_copy_completes)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_mirror *m = test_synced_mirror(dev, 4096, 0, 7);
    memset((unsigned char *)mapping_mirror_cpu(m) + 64, 0x11, 64);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 64, 64));
    test_gate g = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &g));
    CHECK_OK(mapping_mirror_sync_to_gpu(s, m));
    /* Queued, not done: the range is still stale on the GPU and tracked. */
    CHECK(mapping__test_mirror_inflight(m) == 1);
    CHECK(mapping__rs_bytes_in(mapping__test_mirror_stale(m, MAPPING_GPU), 0, 4096) == 64);
    /* A second sync on the same stream queues nothing new. */
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_mirror_sync_to_gpu(s, m));
    CHECK(test_stats(dev).h2d_copies == before.h2d_copies);
    test_gate_open(&g);
    /* stale_bytes waits for the copy, then folds it in. */
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    CHECK(mapping__test_mirror_inflight(m) == 0);
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
    mapping_stream_destroy(s);
}

TEST(mark_waits_for_a_queued_copy_that_reads_the_range)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_mirror *m = test_synced_mirror(dev, 4096, 0, 9);
    mapping_buffer *gpu = mapping_mirror_gpu(m);
    CHECK_OK(mapping_fill_gpu(NULL, gpu, 0, 4096, 0x44));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, 4096));
    CHECK_OK(mapping_mirror_sync_to_cpu(s, m));
    /* Marking the GPU again waits for the queued read (or it would fold over the mark). */
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, 10));
    CHECK(mapping__test_mirror_inflight(m) == 0);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 10);
    unsigned char want[4096];
    memset(want, 0x44, sizeof want);
    CHECK_BYTES(mapping_mirror_cpu(m), want, 4096);
    mapping_mirror_destroy(m);
    mapping_stream_destroy(s);
}

TEST(blocking_sync_is_complete_on_return)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 1 << 16, 0, 10);
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), 0, 1 << 16, 0x55));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, 1 << 16));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK(mapping__test_mirror_inflight(m) == 0 && mapping__rs_count(mapping__test_mirror_stale(m, MAPPING_CPU)) == 0);
    unsigned char *cpu = mapping_mirror_cpu(m);
    for (size_t i = 0; i < 1 << 16; i++)
        CHECK(cpu[i] == 0x55);
    mapping_mirror_destroy(m);
}

TEST(pinned_wrap_page_locks_where_the_back_end_can_and_works_either_way)
{
    mapping_device *dev = test_device();
    unsigned char *user = malloc(1 << 16);
    test_pattern(user, 1 << 16, 13);
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_wrap(dev, user, 1 << 16, MAPPING_MIRROR_PIN, &m));
    printf("%s: wrapped memory %s\n", test_backend(), mapping_mirror_is_pinned(m) ? "page-locked" : "not page-locked");
    if (!dev->be->host_register)
        CHECK(!mapping_mirror_is_pinned(m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
    /* The registration ended with the mirror: the memory is the caller's again. */
    mapping_host_ref ref;
    CHECK(!mapping__host_registry_find(&dev->host_blocks, user, 1, &ref));
    free(user);
}
