/* Several devices: mapping_copy_peer between buffers of two devices. CTest
 * runs these with MAPPING_HOST_DEVICES=2 and POCL_DEVICES="pthread pthread"
 * (tests/CMakeLists.txt), so host and PoCL expose two devices. */
#include "harness.h"

/* Device 1 of the test's back end (closed by the caller), or SKIP. */
static mapping_device *second_device(void)
{
    mapping_device_info infos[4];
    int count = 0;
    CHECK_OK(mapping_list_devices(test_backend(), infos, 4, &count));
    if (count < 2)
        test_skip("%s has %d device(s); a peer copy between two devices needs 2", test_backend(), count);
    mapping_device_desc desc = {.backend = test_backend(), .device = 1};
    mapping_device *dev = NULL;
    CHECK_OK(mapping_open(&desc, &dev));
    mapping_device_info info;
    CHECK_OK(mapping_device_get_info(dev, &info));
    CHECK(info.index == 1);
    return dev;
}

/* Copies n bytes at offsets from a buffer of `from` to one of `to`, blocking
 * and on a stream of `to`, and checks every byte and the counters. */
static void check_peer_copies(mapping_device *from, mapping_device *to, size_t n)
{
    const size_t src_off = 24, dst_off = 40;
    unsigned char *pattern = malloc(n + src_off), *back = malloc(n + dst_off);
    CHECK(pattern && back);
    test_pattern(pattern, n + src_off, (unsigned)n);
    mapping_buffer *src, *dst;
    CHECK_OK(mapping_allocate_gpu(from, n + src_off, &src));
    CHECK_OK(mapping_allocate_gpu(to, n + dst_off, &dst));
    CHECK_OK(mapping_sync_to_gpu(pattern, src));
    CHECK_OK(mapping_fill_gpu(NULL, dst, 0, n + dst_off, 0x5a));
    mapping_stats before = test_stats(to);

    CHECK_OK(mapping_copy_peer(NULL, src, src_off, dst, dst_off, n));
    CHECK_OK(mapping_sync_to_cpu(dst, back));
    for (size_t i = 0; i < dst_off; i++)
        CHECK(back[i] == 0x5a); /* nothing before the range */
    CHECK_BYTES(back + dst_off, pattern + src_off, n);

    /* On a stream of the destination: ordered after the fill before it and
     * before the read after it. */
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(to, &s));
    CHECK_OK(mapping_fill_gpu(s, dst, 0, n + dst_off, 0x00));
    CHECK_OK(mapping_copy_peer(s, src, src_off, dst, dst_off, n));
    CHECK_OK(mapping_fill_gpu(s, dst, dst_off, 8, 0xee)); /* after the copy: it wins */
    memset(back, 0x77, n + dst_off);
    CHECK_OK(mapping_sync_to_cpu_range(s, dst, 0, back, n + dst_off));
    CHECK_OK(mapping_stream_synchronize(s));
    mapping_stream_destroy(s);
    for (size_t i = 0; i < dst_off; i++)
        CHECK(back[i] == 0x00);
    for (size_t i = 0; i < 8; i++)
        CHECK(back[dst_off + i] == 0xee);
    CHECK_BYTES(back + dst_off + 8, pattern + src_off + 8, n - 8);

    mapping_stats after = test_stats(to);
    CHECK(after.peer_copies - before.peer_copies == 2);
    CHECK(after.peer_bytes - before.peer_bytes == 2 * (uint64_t)n);
    mapping_free_gpu(src);
    mapping_free_gpu(dst);
    free(pattern);
    free(back);
}

TEST(peer_copy_between_two_devices)
{
    mapping_device *a = test_device(), *b = second_device();
    check_peer_copies(a, b, 1000);
    check_peer_copies(b, a, 1000);
    check_peer_copies(a, b, (9u << 20) + 13); /* several staging chunks where staged */
    mapping_close(b);
}

TEST(peer_copy_between_two_objects_of_one_device)
{
    check_peer_copies(test_device(), test_device2(), 4096);
}

TEST(peer_copy_between_back_ends_is_staged)
{
    mapping_device *dev = test_device();
    if (strcmp(test_backend(), "host") == 0)
        test_skip("needs a second back end; host to host copies directly");
    mapping_device *host = NULL;
    mapping_device_desc desc = {.backend = "host"};
    CHECK_OK(mapping_open(&desc, &host));
    check_peer_copies(dev, host, 5u << 20);
    check_peer_copies(host, dev, 5u << 20);
    mapping_close(host);
}

TEST(peer_copy_refuses_bad_input)
{
    mapping_device *a = test_device(), *b = test_device2();
    mapping_buffer *src, *dst;
    CHECK_OK(mapping_allocate_gpu(a, 256, &src));
    CHECK_OK(mapping_allocate_gpu(b, 256, &dst));
    mapping_stream *sa, *sb;
    CHECK_OK(mapping_stream_create(a, &sa));
    CHECK_OK(mapping_stream_create(b, &sb));
    CHECK_REFUSED(mapping_copy_peer(NULL, NULL, 0, dst, 0, 16), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_copy_peer(NULL, src, 0, NULL, 0, 16), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_copy_peer(NULL, src, 0, dst, 0, 0), MAPPING_ERR_ZERO_SIZE);
    CHECK_REFUSED(mapping_copy_peer(NULL, src, 250, dst, 0, 16), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_copy_peer(NULL, src, 0, dst, 241, 16), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_copy_peer(NULL, src, SIZE_MAX, dst, 0, 2), MAPPING_ERR_OUT_OF_RANGE);
    /* The stream is the destination's. */
    CHECK_REFUSED(mapping_copy_peer(sa, src, 0, dst, 0, 16), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK(strstr(mapping_last_error_message(), "destination") != NULL);
    CHECK_REFUSED(mapping_copy_peer(NULL, src, 0, src, 8, 16), MAPPING_ERR_OVERLAP);
    CHECK_OK(mapping_copy_peer(sb, src, 0, dst, 0, 16));
    CHECK_OK(mapping_copy_peer(NULL, src, 0, src, 16, 16)); /* one device: a device copy */
    CHECK_OK(mapping_stream_synchronize(sb));
    mapping_stream_destroy(sa);
    mapping_stream_destroy(sb);
    mapping_free_gpu(src);
    mapping_free_gpu(dst);
}

TEST(host_exposes_virtual_devices_each_with_its_own_memory)
{
    if (strcmp(test_backend(), "host") != 0)
        test_skip("MAPPING_HOST_DEVICES is the host back end's");
    const char *env = getenv("MAPPING_HOST_DEVICES");
    int want = env ? atoi(env) : 1;
    mapping_device_info infos[8];
    int count = 0;
    CHECK_OK(mapping_list_devices("host", infos, 8, &count));
    CHECK(count == want);
    if (count < 2)
        test_skip("MAPPING_HOST_DEVICES is %s: one device", env ? env : "unset");
    CHECK(infos[1].index == 1 && strcmp(infos[0].name, infos[1].name) != 0);
    mapping_device *b = second_device();
    mapping_buffer *x, *y;
    CHECK_OK(mapping_allocate_gpu(test_device(), 64, &x));
    CHECK_OK(mapping_allocate_gpu(b, 64, &y));
    void *nx, *ny;
    CHECK_OK(mapping_buffer_native(x, &nx));
    CHECK_OK(mapping_buffer_native(y, &ny));
    CHECK(nx != ny);
    /* Device buffers of different devices do not mix in device copies. */
    CHECK_REFUSED(mapping_copy_gpu(NULL, x, 0, y, 0, 64), MAPPING_ERR_DEVICE_MISMATCH);
    mapping_free_gpu(x);
    mapping_free_gpu(y);
    mapping_close(b);
}
