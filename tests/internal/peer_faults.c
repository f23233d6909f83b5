/* Several devices under fault injection: a refused peer copy touches
 * nothing and counts nothing; a refused multimirror sync leaves the target
 * stale so the next sync retries. */
#include <stdio.h>
#include "harness.h"
#include "testing/test_hooks.h"

TEST(refused_peer_copy_leaves_the_destination_and_the_counters_alone)
{
    mapping_device *a = test_device(), *b = test_device2();
    enum { N = 4096 };
    unsigned char in[N], out[N], before[N];
    test_pattern(in, N, 1);
    mapping_buffer *src, *dst;
    CHECK_OK(mapping_allocate_gpu(a, N, &src));
    CHECK_OK(mapping_allocate_gpu(b, N, &dst));
    CHECK_OK(mapping_sync_to_gpu(in, src));
    CHECK_OK(mapping_fill_gpu(NULL, dst, 0, N, 0x11));
    CHECK_OK(mapping_sync_to_cpu(dst, before));
    mapping_stats s0 = test_stats(b);
    mapping__inject_fault(b, 0); /* the destination's next operation fails */
    CHECK_REFUSED(mapping_copy_peer(NULL, src, 0, dst, 0, N), MAPPING_ERR_FAULT_INJECTED);
    mapping_stats s1 = test_stats(b);
    CHECK(s1.peer_bytes == s0.peer_bytes && s1.peer_copies == s0.peer_copies);
    CHECK_OK(mapping_sync_to_cpu(dst, out));
    CHECK_BYTES(out, before, N);
    CHECK_OK(mapping_copy_peer(NULL, src, 0, dst, 0, N)); /* disarmed after firing */
    CHECK_OK(mapping_sync_to_cpu(dst, out));
    CHECK_BYTES(out, in, N);
    mapping_free_gpu(src);
    mapping_free_gpu(dst);
}

TEST(refused_multimirror_sync_leaves_the_target_stale)
{
    mapping_device *devs[2] = {test_device(), test_device2()};
    mapping_multimirror *m;
    CHECK_OK(mapping_multimirror_create(devs, 2, 1024, &m));
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 0));
    CHECK_OK(mapping_multimirror_mark_gpu_modified(m, 0, 0, 512));
    mapping_link link;
    CHECK_OK(mapping_device_link(devs[1], &link)); /* measured before arming the fault */
    mapping__inject_fault(devs[1], 0);
    mapping_status st = mapping_multimirror_sync_to_gpu(NULL, m, 1);
    CHECK(st == MAPPING_ERR_FAULT_INJECTED);
    CHECK(mapping_multimirror_stale_bytes(m, 1) == 1024);
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1));
    CHECK(mapping_multimirror_stale_bytes(m, 1) == 0);
    mapping_multimirror_destroy(m);
}

/* A multimirror mark that runs out of host memory changes no side: every
 * side's sets get their room before any of them changes (all or nothing). */
TEST(a_multimirror_mark_out_of_memory_changes_no_side)
{
    mapping_device *dev = test_device();
    enum { SIZE = 1 << 16, MARKS = 200 };
    mapping_multimirror *m;
    CHECK_OK(mapping_multimirror_create(&dev, 1, SIZE, &m));
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 0));
    CHECK(mapping_multimirror_stale_bytes(m, 0) == 0);
    int refused = 0;
    for (int k = 0; k < MARKS; k++) {
        size_t before = mapping_multimirror_stale_bytes(m, 0);
        mapping_os_inject_alloc_fault(k % 3); /* the first, second or third allocation of the mark fails */
        mapping_status st = mapping_multimirror_mark_cpu_modified(m, (size_t)k * 256, 8);
        mapping_os_inject_alloc_fault(-1);
        size_t after = mapping_multimirror_stale_bytes(m, 0);
        if (st == MAPPING_OK) {
            CHECK(after == before + 8);
        } else {
            CHECK(st == MAPPING_ERR_OUT_OF_HOST_MEMORY);
            CHECK(after == before);
            refused++;
        }
    }
    printf("%d of %d marks refused for memory, no side changed by them\n", refused, MARKS);
    CHECK(refused > 0);
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 0));
    CHECK(mapping_multimirror_stale_bytes(m, 0) == 0);
    mapping_multimirror_destroy(m);
}
