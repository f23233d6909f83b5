/* mapping_device_set_host_registration and mapping_host_registration_forget
 * on every back end: arguments checked; where the back end can page-lock in
 * place, copies of registered pageable memory move the right bytes, both
 * ways, on a stream and blocking, and forgetting or turning it off leaves
 * copies working; elsewhere MAPPING_ERR_UNSUPPORTED. And
 * mapping_device_wait_native's arguments. */
#include <stdint.h>
#include "harness.h"

TEST(host_registration_is_checked_and_copies_stay_right)
{
    mapping_device *dev = test_device();
    enum { MIB = 1 << 20, BYTES = 4 * MIB };
    CHECK_REFUSED(mapping_device_set_host_registration(NULL, MIB, MIB), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_device_set_host_registration(dev, 1, MIB), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_device_set_host_registration(dev, 2 * MIB, MIB), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_device_set_host_registration(dev, 0, MIB), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_host_registration_forget(dev, NULL, 1), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_OK(mapping_device_set_host_registration(dev, 0, 0)); /* off: always accepted */
    mapping_status st = mapping_device_set_host_registration(dev, MIB, 4 * MIB);
    if (st == MAPPING_ERR_UNSUPPORTED)
        return; /* the back end cannot page-lock in place */
    CHECK_OK(st);
    unsigned char *host = aligned_alloc(2 * MIB, BYTES), *want = malloc(BYTES);
    CHECK(host && want);
    mapping_buffer *buf;
    mapping_stream *s;
    CHECK_OK(mapping_allocate_gpu(dev, BYTES, &buf));
    CHECK_OK(mapping_stream_create(dev, &s));
    for (unsigned round = 0; round < 3; round++) {
        test_pattern(want, BYTES, round + 1);
        memcpy(host, want, BYTES);
        CHECK_OK(mapping_sync_to_gpu_range(round == 1 ? NULL : s, host, buf, 0, BYTES));
        CHECK_OK(mapping_stream_synchronize(s));
        memset(host, 0, BYTES);
        CHECK_OK(mapping_sync_to_cpu_range(round == 1 ? NULL : s, buf, 0, host, BYTES));
        CHECK_OK(mapping_stream_synchronize(s));
        CHECK_BYTES(host, want, BYTES);
        if (round == 1)
            CHECK_OK(mapping_host_registration_forget(dev, host, BYTES));
    }
    CHECK_OK(mapping_device_set_host_registration(dev, 0, 0));
    CHECK_OK(mapping_sync_to_cpu(buf, host));
    CHECK_BYTES(host, want, BYTES);
    mapping_stream_destroy(s);
    mapping_free_gpu(buf);
    free(host);
    free(want);
}

TEST(wait_native_checks_its_arguments)
{
    mapping_device *dev = test_device();
    CHECK_REFUSED(mapping_device_wait_native(NULL, NULL), MAPPING_ERR_NULL_ARGUMENT);
    mapping_status st = mapping_device_wait_native(dev, NULL);
    /* NULL: the default native queue (CUDA), nothing to wait for (host), or none to name (OpenCL). */
    CHECK(st == MAPPING_OK || st == MAPPING_ERR_NULL_ARGUMENT);
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_stream_synchronize(s));
    mapping_stream_destroy(s);
}
