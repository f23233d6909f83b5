/*
 * Several OpenCL devices: the devices of one platform share a context (the
 * peer copy is then clEnqueueCopyBuffer), and with
 * MAPPING_OPENCL_SHARED_CONTEXT=0 each has its own. CTest runs these with
 * POCL_DEVICES="pthread pthread" (tests/CMakeLists.txt).
 */
#include "harness.h"

static mapping_device *open_index(int index)
{
    mapping_device_info infos[4];
    int count = 0;
    CHECK_OK(mapping_list_devices("opencl", infos, 4, &count));
    if (count <= index)
        test_skip("OpenCL has %d device(s) here; this test needs %d", count, index + 1);
    mapping_device *dev = NULL;
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = "opencl", .device = index}, &dev));
    return dev;
}

UNIT_TEST(opencl_devices_of_one_platform_share_a_context)
{
    mapping_device *a = open_index(0), *b = open_index(1);
    mapping_native_device na, nb;
    CHECK_OK(mapping_device_native(a, &na));
    CHECK_OK(mapping_device_native(b, &nb));
    if (na.platform != nb.platform)
        test_skip("devices 0 and 1 are of different platforms");
    const char *env = getenv("MAPPING_OPENCL_SHARED_CONTEXT");
    int sharing = !(env && strcmp(env, "0") == 0);
    CHECK((na.context == nb.context) == sharing);
    CHECK(na.device != nb.device);
    /* The peer copy works either way (clEnqueueCopyBuffer, or staged). */
    enum { N = (9 << 20) + 5 };
    unsigned char *in = malloc(N), *out = malloc(N);
    CHECK(in && out);
    test_pattern(in, N, 3);
    mapping_buffer *x, *y;
    CHECK_OK(mapping_allocate_gpu(a, N, &x));
    CHECK_OK(mapping_allocate_gpu(b, N, &y));
    CHECK_OK(mapping_sync_to_gpu(in, x));
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(b, &s));
    CHECK_OK(mapping_copy_peer(s, x, 0, y, 0, N));
    CHECK_OK(mapping_sync_to_cpu_range(s, y, 0, out, N));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_BYTES(out, in, N);
    mapping_stream_destroy(s);
    mapping_free_gpu(x);
    mapping_free_gpu(y);
    free(in);
    free(out);
    mapping_close(a);
    mapping_close(b);
}
