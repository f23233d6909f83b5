/* Planning a flush: which copies merge, which go straight through. */
#include "harness.h"
#include "transfer/transfer.h"

UNIT_TEST(batch_plan_merges_touching_and_overlapping_ranges_per_buffer_and_direction)
{
    mapping_device *dev;
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = "host"}, &dev));
    mapping_buffer *a, *b;
    CHECK_OK(mapping_allocate_gpu(dev, 1 << 20, &a));
    CHECK_OK(mapping_allocate_gpu(dev, 1 << 20, &b));
    unsigned char host[4096];
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    CHECK_OK(mapping_batch_add_to_gpu(batch, host, a, 64, 64));     /* [64,128) touches [0,64) */
    CHECK_OK(mapping_batch_add_to_gpu(batch, host, a, 0, 64));
    CHECK_OK(mapping_batch_add_to_gpu(batch, host, a, 100, 100));   /* overlaps: [0,200) */
    CHECK_OK(mapping_batch_add_to_gpu(batch, host, a, 1000, 10));   /* apart */
    CHECK_OK(mapping_batch_add_to_gpu(batch, host, b, 0, 64));      /* another buffer */
    CHECK_OK(mapping_batch_add_to_cpu(batch, a, 0, host, 64));      /* another direction */
    CHECK_OK(mapping_batch_add_to_cpu(batch, a, 64, host, 4096));   /* large: [64, 4160) */
    batch_plan plan = {0};
    CHECK_OK(mapping__batch_plan(batch, &plan, 4096));
    CHECK(plan.group_count == 4); /* a: 2, b: 1, and one device-to-host */
    CHECK(plan.h2d_groups == 3);
    size_t sizes[8] = {0}, staged = 0;
    for (size_t g = 0; g < plan.group_count; g++) {
        sizes[g] = plan.groups[g].hi - plan.groups[g].lo;
        staged += plan.groups[g].staged;
    }
    /* a's [0,200) and [1000,1010) (or b first: buffers sort by address). */
    size_t a_first = (uintptr_t)a < (uintptr_t)b ? 0 : 1;
    CHECK(sizes[a_first] == 200 && sizes[a_first + 1] == 10);
    CHECK(plan.groups[plan.group_of[1]].lo == 0 && plan.group_of[0] == plan.group_of[2]);
    CHECK(plan.groups[3].lo == 0 && plan.groups[3].hi == 4160 && plan.groups[3].count == 2);
    CHECK(plan.groups[3].staged); /* a small member makes the whole group staged */
    CHECK(staged == 4);
    CHECK(plan.h2d_staged == 3 && plan.d2h_staged == 1);
    CHECK(plan.staging_bytes >= 200 + 10 + 64 + 4160);
    mapping__batch_plan_free(&plan);
    mapping_batch_destroy(batch);
    mapping_close(dev);
}

UNIT_TEST(batch_plan_sends_groups_of_only_large_copies_straight_through)
{
    mapping_device *dev;
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = "host"}, &dev));
    mapping_buffer *a;
    CHECK_OK(mapping_allocate_gpu(dev, 1 << 20, &a));
    static unsigned char host[1 << 16];
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    CHECK_OK(mapping_batch_add_to_gpu(batch, host, a, 0, 8192));
    CHECK_OK(mapping_batch_add_to_gpu(batch, host, a, 8192, 8192));
    CHECK_OK(mapping_batch_add_to_gpu(batch, host, a, 100000, 10));
    batch_plan plan = {0};
    CHECK_OK(mapping__batch_plan(batch, &plan, 4096));
    CHECK(plan.group_count == 2);
    CHECK(!plan.groups[0].staged && plan.groups[0].count == 2);
    CHECK(plan.groups[1].staged);
    CHECK(plan.h2d_staged == 1);
    mapping__batch_plan_free(&plan);
    mapping_batch_destroy(batch);
    mapping_close(dev);
}
