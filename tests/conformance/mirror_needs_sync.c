/*
 * mapping_mirror_needs_sync: whether a sync to a side would copy anything,
 * answered without waiting for queued copies (which count as done).
 */
#include "harness.h"

static int needs(const mapping_mirror *m, mapping_side side)
{
    int out = -1;
    CHECK_OK(mapping_mirror_needs_sync(m, side, &out));
    CHECK(out == 0 || out == 1);
    return out;
}

TEST(needs_sync_follows_marks_and_syncs)
{
    mapping_device *dev = test_device();
    mapping_mirror *m, *left, *right;
    CHECK_OK(mapping_mirror_create(dev, 8192, 0, &m));
    CHECK(needs(m, MAPPING_GPU) == 1 && needs(m, MAPPING_CPU) == 0); /* a new mirror: GPU stale */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(needs(m, MAPPING_GPU) == 0 && needs(m, MAPPING_CPU) == 0);
    CHECK_OK(mapping_mirror_view(m, 0, 4096, &left));
    CHECK_OK(mapping_mirror_view(m, 4096, 4096, &right));
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 100, 10));
    CHECK(needs(m, MAPPING_GPU) == 1 && needs(m, MAPPING_CPU) == 0);
    CHECK(needs(left, MAPPING_GPU) == 1 && needs(right, MAPPING_GPU) == 0); /* only the view that holds it */
    CHECK_OK(mapping_mirror_mark_gpu_modified(right, 10, 20));
    CHECK(needs(right, MAPPING_CPU) == 1 && needs(left, MAPPING_CPU) == 0 && needs(m, MAPPING_CPU) == 1);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, left));
    CHECK(needs(m, MAPPING_GPU) == 0 && needs(m, MAPPING_CPU) == 1);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK(needs(m, MAPPING_GPU) == 0 && needs(m, MAPPING_CPU) == 0);
    /* Agrees with stale_bytes once nothing is queued. */
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 8000, 192));
    CHECK(needs(right, MAPPING_GPU) == (mapping_mirror_stale_bytes(right, MAPPING_GPU) != 0));
    CHECK(needs(left, MAPPING_GPU) == (mapping_mirror_stale_bytes(left, MAPPING_GPU) != 0));
    CHECK(needs(left, MAPPING_GPU) == 0 && needs(right, MAPPING_GPU) == 1);
    mapping_mirror_destroy(left);
    mapping_mirror_destroy(right);
    mapping_mirror_destroy(m);
}

TEST(needs_sync_counts_queued_copies_as_done_without_waiting)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_mirror *m = test_synced_mirror(dev, 1 << 16, 0, 21), *head, *tail;
    CHECK_OK(mapping_mirror_view(m, 0, 4096, &head));
    CHECK_OK(mapping_mirror_view(m, 32768, 4096, &tail));
    unsigned char *cpu = mapping_mirror_cpu(m);
    for (size_t i = 0; i < 20; i++) { /* 20 ranges: a many-range sync (packed where the back end packs) */
        memset(cpu + i * 128, 0x40 + (int)i, 32);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, i * 128, 32));
    }
    test_gate g = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &g)); /* holds the stream */
    CHECK_OK(mapping_mirror_sync_to_gpu(s, head));       /* queued behind the gate */
    CHECK(needs(head, MAPPING_GPU) == 0);                /* queued counts as done */
    CHECK(needs(m, MAPPING_GPU) == 0);
    memset(cpu + 32768 + 100, 0x77, 50);
    CHECK_OK(mapping_mirror_mark_cpu_modified(tail, 100, 50)); /* apart from the queued copy */
    CHECK(needs(m, MAPPING_GPU) == 1 && needs(tail, MAPPING_GPU) == 1 && needs(head, MAPPING_GPU) == 0);
    CHECK(needs(m, MAPPING_CPU) == 0);
    CHECK(test_gate_passed(&g) == 0); /* nothing above waited for the stream */
    test_gate_open(&g);
    CHECK(mapping_mirror_stale_bytes(head, MAPPING_GPU) == 0); /* waits: the copies completed */
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 50);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(needs(m, MAPPING_GPU) == 0);
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(head);
    mapping_mirror_destroy(tail);
    mapping_mirror_destroy(m);
    mapping_stream_destroy(s);
}

TEST(needs_sync_refuses_bad_arguments)
{
    mapping_device *dev = test_device();
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, 256, 0, &m));
    int out = 7;
    CHECK_REFUSED(mapping_mirror_needs_sync(NULL, MAPPING_GPU, &out), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(out == 0);
    out = 7;
    CHECK_REFUSED(mapping_mirror_needs_sync(m, (mapping_side)3, &out), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(out == 0);
    CHECK_REFUSED(mapping_mirror_needs_sync(m, MAPPING_GPU, NULL), MAPPING_ERR_NULL_ARGUMENT);
    mapping_mirror_destroy(m);
    out = 7;
    CHECK_REFUSED(mapping_mirror_needs_sync(m, MAPPING_GPU, &out), MAPPING_ERR_INVALID_HANDLE);
    CHECK(out == 0);
}

TEST(needs_sync_sees_the_writes_of_a_tracked_mirror)
{
    mapping_device *dev = test_device();
    if (mapping_write_tracking(NULL) == MAPPING_TRACK_NONE)
        test_skip("no write tracking here: %s", mapping_write_tracking_description());
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, 1 << 16, MAPPING_MIRROR_TRACK_WRITES, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(needs(m, MAPPING_GPU) == 0);
    ((unsigned char *)mapping_mirror_cpu(m))[40000] = 0x5A; /* written, never marked */
    CHECK(needs(m, MAPPING_GPU) == 1 && needs(m, MAPPING_CPU) == 0);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(needs(m, MAPPING_GPU) == 0);
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
}
