/* Mirrors: views, unified memory and failed copies, checked against the
 * state behind them through the test hooks (tests/conformance/mirror_views.c
 * has the rest). */
#include "testing/test_hooks.h"
#include "harness.h"

TEST(marking_a_view_changes_exactly_its_bytes_in_the_parent)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 10000, 0, 21), *v;
    CHECK_OK(mapping_mirror_view(m, 3000, 2000, &v));
    CHECK(mapping_mirror_size(v) == 2000 && mapping_mirror_gpu_offset(v) == 3000);
    CHECK((unsigned char *)mapping_mirror_cpu(v) == (unsigned char *)mapping_mirror_cpu(m) + 3000);
    CHECK(mapping_mirror_gpu(v) == mapping_mirror_gpu(m));
    CHECK_OK(mapping_mirror_mark_cpu_modified(v, 100, 50)); /* parent bytes [3100, 3150) */
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 50);
    CHECK(mapping_mirror_stale_bytes(v, MAPPING_GPU) == 50);
    mapping_rs_cursor c;
    mapping_range r;
    CHECK(mapping__rs_count(mapping__test_mirror_stale(m, MAPPING_GPU)) == 1 &&
          mapping__rs_seek(mapping__test_mirror_stale(m, MAPPING_GPU), 0, &c, &r) && r.lo == 3100);
    mapping_mirror_destroy(v);
    mapping_mirror_destroy(m);
}

TEST(view_of_a_view_addresses_the_root_at_the_summed_offset)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 10000, 0, 21), *v, *vv;
    CHECK_OK(mapping_mirror_view(m, 1000, 5000, &v));
    CHECK_OK(mapping_mirror_view(v, 500, 100, &vv));
    CHECK(mapping_mirror_gpu_offset(vv) == 1500 && mapping_mirror_size(vv) == 100);
    mapping_mirror_destroy(vv);
    CHECK_STATUS(mapping_mirror_view(v, 4950, 100, &vv), MAPPING_ERR_OUT_OF_RANGE); /* past the view */
    CHECK(vv == NULL);
    CHECK_OK(mapping_mirror_view(v, 500, 100, &vv));
    CHECK_OK(mapping_mirror_mark_gpu_modified(vv, 0, 100));
    CHECK(mapping__rs_bytes_in(mapping__test_mirror_stale(m, MAPPING_CPU), 1500, 1600) == 100);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 100);
    mapping_mirror_destroy(vv);
    mapping_mirror_destroy(v);
    mapping_mirror_destroy(m);
}

TEST(unified_mirror_says_which_memory_it_got_and_syncs_without_copies)
{
    mapping_device *dev = test_device();
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, 1 << 16, MAPPING_MIRROR_UNIFIED, &m));
    int unified = mapping_mirror_is_unified(m);
    printf("%s: unified mirror %s\n", test_backend(), unified ? "in unified memory" : "fell back to two copies");
    if (dev->be->buffer_alloc_unified == NULL)
        CHECK(!unified);
    unsigned char *cpu = mapping_mirror_cpu(m);
    memset(cpu, 0x71, 1 << 16);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, 1 << 16));
    mapping_stats before, after;
    CHECK_OK(mapping_device_stats(dev, &before));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK_OK(mapping_device_stats(dev, &after));
    CHECK(unified ? after.h2d_bytes == before.h2d_bytes : after.h2d_bytes - before.h2d_bytes == 1 << 16);
    unsigned char back[256];
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), 1000, back, sizeof back));
    for (size_t i = 0; i < sizeof back; i++)
        CHECK(back[i] == 0x71);
    mapping_mirror_destroy(m);
}

TEST(a_failed_copy_leaves_the_target_stale)
{
    mapping_device *dev = test_device();
    mapping_device_set_link(dev, &(mapping_link){1e-12, 1e9});
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, 4096, 0, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, 10));
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 2000, 10));
    mapping__inject_fault(dev, 1); /* the second copy fails */
    CHECK_STATUS(mapping_mirror_sync_to_gpu(NULL, m), MAPPING_ERR_FAULT_INJECTED);
    mapping__inject_fault(dev, -1);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 20);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    mapping_mirror_destroy(m);
}
