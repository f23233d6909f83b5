/* Mirrors: views, conflicts, access intents, bad inputs (the checks that
 * read the state behind them: tests/internal/mirror_views_state.c). */
#include "harness.h"

/* ---- views ---- */

TEST(syncing_a_view_leaves_its_siblings_untouched)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 8192, 0, 21), *a, *b;
    CHECK_OK(mapping_mirror_view(m, 0, 4096, &a));
    CHECK_OK(mapping_mirror_view(m, 4096, 4096, &b));
    unsigned char *cpu = mapping_mirror_cpu(m);
    memset(cpu, 1, 8192);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, 8192));
    mapping_stats before, after;
    CHECK_OK(mapping_device_stats(dev, &before));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, a));
    CHECK_OK(mapping_device_stats(dev, &after));
    CHECK(after.h2d_bytes - before.h2d_bytes == 4096);
    CHECK(mapping_mirror_stale_bytes(a, MAPPING_GPU) == 0);
    CHECK(mapping_mirror_stale_bytes(b, MAPPING_GPU) == 4096);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 4096);
    /* The view's GPU bytes hold the new content. */
    unsigned char back[4096];
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), 0, back, 4096));
    for (size_t i = 0; i < 4096; i++)
        CHECK(back[i] == 1);
    mapping_mirror_destroy(a);
    mapping_mirror_destroy(b);
    mapping_mirror_destroy(m);
}

TEST(destroying_the_parent_keeps_its_views_working)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 4096, 0, 21), *v, *vv;
    CHECK_OK(mapping_mirror_view(m, 1024, 2048, &v));
    mapping_mirror_destroy(m); /* the views hold the shared state */
    CHECK_OK(mapping_mirror_view(v, 0, 16, &vv));
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(v), 1024, 2048, 0x5A));
    CHECK_OK(mapping_mirror_mark_gpu_modified(v, 0, 2048));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, vv));
    CHECK(mapping_mirror_stale_bytes(v, MAPPING_CPU) == 2048 - 16);
    CHECK(((unsigned char *)mapping_mirror_cpu(vv))[15] == 0x5A);
    mapping_mirror_destroy(v);
    CHECK(mapping_mirror_stale_bytes(vv, MAPPING_CPU) == 0);
    mapping_mirror_destroy(vv); /* the last handle frees the memory */
}

/* ---- conflicts ---- */

TEST(marking_both_sides_is_a_conflict_and_changes_nothing)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 4096, 0, 21);
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 100, 100));
    mapping_stats before, after;
    CHECK_OK(mapping_device_stats(dev, &before));
    CHECK_STATUS(mapping_mirror_mark_cpu_modified(m, 150, 100), MAPPING_ERR_CONFLICT);
    CHECK_OK(mapping_device_stats(dev, &after));
    CHECK(after.conflicts - before.conflicts == 1);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 100);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    /* Next to it is fine; after a sync it is fine too. */
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 200, 100));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 150, 100));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 150 && mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0);
    mapping_mirror_destroy(m);
}

TEST(the_gpu_side_may_be_written_first_without_conflict)
{
    mapping_device *dev = test_device();
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, 4096, 0, &m)); /* GPU stale: initial, not modified */
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), 0, 4096, 0x42));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, 4096));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 4096);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK(((unsigned char *)mapping_mirror_cpu(m))[4095] == 0x42);
    mapping_mirror_destroy(m);
}

/* ---- access intents ---- */

TEST(acquire_cpu_for_read_syncs_first)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 4096, 0, 21);
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), 0, 4096, 0x31));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, 4096));
    unsigned char *p;
    CHECK_OK(mapping_mirror_acquire_cpu(m, MAPPING_READ, (void **)&p));
    CHECK(p == mapping_mirror_cpu(m) && p[0] == 0x31 && p[4095] == 0x31);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0 && mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    mapping_mirror_destroy(m);
}

TEST(acquire_for_write_marks_the_other_side_stale)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_mirror *m = test_synced_mirror(dev, 4096, 0, 21), *v;
    CHECK_OK(mapping_mirror_view(m, 1000, 500, &v));
    unsigned char *p;
    CHECK_OK(mapping_mirror_acquire_cpu(v, MAPPING_READ | MAPPING_WRITE, (void **)&p));
    memset(p, 0x61, 500);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 500);
    mapping_buffer *buf;
    CHECK_OK(mapping_mirror_acquire_gpu(s, v, MAPPING_READ | MAPPING_WRITE, &buf)); /* syncs first, on s */
    CHECK_OK(mapping_fill_gpu(s, buf, mapping_mirror_gpu_offset(v), 10, 0x62));
    CHECK_OK(mapping_mirror_release_gpu(s, v));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 500);
    CHECK_OK(mapping_mirror_acquire_cpu(m, MAPPING_READ, (void **)&p));
    CHECK(p[1000] == 0x62 && p[1009] == 0x62 && p[1010] == 0x61 && p[1499] == 0x61);
    mapping_mirror_destroy(v);
    mapping_mirror_destroy(m);
    mapping_stream_destroy(s);
}

TEST(write_only_acquire_discards_without_copying)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 1 << 16, 0, 21);
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, 1 << 16)); /* the GPU has news ... */
    mapping_stats before, after;
    CHECK_OK(mapping_device_stats(dev, &before));
    void *p;
    CHECK_OK(mapping_mirror_acquire_cpu(m, MAPPING_WRITE, &p)); /* ... which we overwrite whole */
    CHECK_OK(mapping_device_stats(dev, &after));
    CHECK(after.d2h_bytes == before.d2h_bytes && after.conflicts == before.conflicts);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 1 << 16);
    mapping_buffer *buf;
    CHECK_OK(mapping_mirror_acquire_gpu(NULL, m, MAPPING_WRITE, &buf));
    CHECK_OK(mapping_device_stats(dev, &after));
    CHECK(after.h2d_bytes == before.h2d_bytes);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 1 << 16);
    mapping_mirror_destroy(m);
}

/* ---- bad inputs ---- */

TEST(mirror_bad_inputs_are_refused_with_clear_statuses)
{
    mapping_device *dev = test_device();
    mapping_mirror *m, *v = (mapping_mirror *)1;
    char user[64];
    CHECK_STATUS(mapping_mirror_create(NULL, 10, 0, &m), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_mirror_create(dev, 10, 0, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_mirror_create(dev, 0, 0, &m), MAPPING_ERR_ZERO_SIZE);
    CHECK_STATUS(mapping_mirror_create(dev, 10, 0x80, &m), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mapping_mirror_wrap(dev, NULL, 10, 0, &m), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_mirror_wrap(dev, user, 0, 0, &m), MAPPING_ERR_ZERO_SIZE);
    CHECK_STATUS(mapping_mirror_wrap(dev, (void *)(uintptr_t)-16, 64, 0, &m), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_OK(mapping_mirror_create(dev, 1000, 0, &m));
    /* Ranges: zero, past the end, overflowing. */
    CHECK_STATUS(mapping_mirror_mark_cpu_modified(m, 0, 0), MAPPING_ERR_ZERO_SIZE);
    CHECK_STATUS(mapping_mirror_mark_cpu_modified(m, 1000, 1), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_STATUS(mapping_mirror_mark_gpu_modified(m, 999, 2), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_STATUS(mapping_mirror_mark_gpu_modified(m, 10, SIZE_MAX), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_STATUS(mapping_mirror_mark_gpu_modified(m, SIZE_MAX, 2), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_STATUS(mapping_mirror_mark_cpu_modified(NULL, 0, 1), MAPPING_ERR_NULL_ARGUMENT);
    /* Views outside the parent. */
    CHECK_STATUS(mapping_mirror_view(m, 900, 101, &v), MAPPING_ERR_OUT_OF_RANGE);
    CHECK(v == NULL);
    CHECK_STATUS(mapping_mirror_view(m, SIZE_MAX, 2, &v), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_STATUS(mapping_mirror_view(m, 0, 0, &v), MAPPING_ERR_ZERO_SIZE);
    CHECK_STATUS(mapping_mirror_view(NULL, 0, 1, &v), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_mirror_view(m, 0, 1, NULL), MAPPING_ERR_NULL_ARGUMENT);
    /* Syncs and queries. */
    CHECK_STATUS(mapping_mirror_sync_to_gpu(NULL, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_mirror_sync_to_cpu(NULL, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(mapping_mirror_stale_bytes(NULL, MAPPING_CPU) == 0);
    CHECK(mapping_mirror_stale_bytes(m, (mapping_side)7) == 0 && mapping_last_error() == MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(mapping_mirror_size(NULL) == 0 && mapping_mirror_cpu(NULL) == NULL && mapping_mirror_gpu(NULL) == NULL);
    CHECK(mapping_mirror_is_unified(NULL) == 0);
    /* Access intents. */
    void *p;
    mapping_buffer *buf;
    CHECK_STATUS(mapping_mirror_acquire_cpu(m, 0, &p), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mapping_mirror_acquire_cpu(m, 4, &p), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mapping_mirror_acquire_cpu(m, MAPPING_READ, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_mirror_acquire_gpu(NULL, m, 0, &buf), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mapping_mirror_acquire_gpu(NULL, NULL, MAPPING_READ, &buf), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_mirror_release_gpu(NULL, NULL), MAPPING_ERR_NULL_ARGUMENT);
    mapping_mirror_destroy(NULL); /* no-op */
    /* Nothing above changed the state. */
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 1000 && mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0);
    mapping_mirror_destroy(m);
}

TEST(a_stream_of_another_device_is_refused)
{
    mapping_device *dev = test_device(), *other = test_device2();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(other, &s));
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, 100, 0, &m));
    mapping_buffer *buf;
    CHECK_STATUS(mapping_mirror_sync_to_gpu(s, m), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK_STATUS(mapping_mirror_sync_to_cpu(s, m), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK_STATUS(mapping_mirror_acquire_gpu(s, m, MAPPING_READ, &buf), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK_STATUS(mapping_mirror_release_gpu(s, m), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 100);
    mapping_mirror_destroy(m);
    mapping_stream_destroy(s);
}
