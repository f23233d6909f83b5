/*
 * The bad-input table, the part that needs the library's internals: a stale
 * handle (a copy of a live handle's struct marked dead) is refused, and an
 * injected driver fault is reported and changes nothing
 * (tests/conformance/bad_input.c has the rest).
 */
#include "testing/test_hooks.h"
#include "harness.h"

TEST(destroyed_handles_are_reported_not_used)
{
    /* A handle is looked up in the registry of live objects, never read
     * first: a copy of a live buffer's struct (at another address) and a
     * zeroed device struct are not handles. */
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 64, &buf));
    struct mapping_buffer dead = *buf;
    unsigned char host[64] = {0};
    CHECK_REFUSED(mapping_sync_to_gpu(host, &dead), MAPPING_ERR_INVALID_HANDLE);
    struct mapping_device dead_dev;
    memset(&dead_dev, 0, sizeof dead_dev);
    CHECK_REFUSED(mapping_allocate_gpu(&dead_dev, 64, &buf), MAPPING_ERR_INVALID_HANDLE);
    mapping_free_gpu(buf == NULL ? NULL : buf);
}

TEST(an_injected_driver_fault_is_reported_and_leaves_the_source_intact)
{
    mapping_device *dev = test_device();
    enum { N = 512 };
    unsigned char in[N], before[N], out[N];
    test_pattern(in, N, 22);
    memcpy(before, in, N);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    CHECK_OK(mapping_sync_to_gpu(in, buf));
    mapping__inject_fault(dev, 0);
    unsigned char other[N];
    test_pattern(other, N, 23);
    CHECK_REFUSED(mapping_sync_to_gpu(other, buf), MAPPING_ERR_FAULT_INJECTED);
    CHECK_OK(mapping_sync_to_cpu(buf, out)); /* one fault per arming */
    CHECK_BYTES(out, before, N);             /* the refused copy moved nothing */
    CHECK_BYTES(in, before, N);
    mapping__inject_fault(dev, 1); /* the second operation fails */
    CHECK_OK(mapping_fill_gpu(NULL, buf, 0, 16, 0));
    CHECK_REFUSED(mapping_fill_gpu(NULL, buf, 0, 16, 1), MAPPING_ERR_FAULT_INJECTED);
    mapping_free_gpu(buf);
}
