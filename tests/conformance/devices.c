/* Devices: listing, information, native handles, the link, statistics. */
#include "harness.h"

TEST(back_ends_are_listed_with_a_reason_when_unavailable)
{
    mapping_device *dev = test_device();
    mapping_backend_info infos[8];
    int count = 0;
    CHECK_OK(mapping_list_backends(infos, 8, &count));
    CHECK(count == 3);
    CHECK(strcmp(infos[0].name, "host") == 0 && infos[0].available && infos[0].device_count == 1);
    int found = 0;
    for (int i = 0; i < count; i++) {
        CHECK(infos[i].available == (infos[i].reason[0] == '\0'));
        if (strcmp(infos[i].name, mapping_backend_name(dev)) == 0)
            found = infos[i].available;
    }
    CHECK(found);
    int n = -1;
    CHECK_OK(mapping_list_backends(NULL, 0, &n)); /* only the count */
    CHECK(n == count);
}

TEST(device_info_describes_the_opened_device)
{
    mapping_device *dev = test_device();
    mapping_device_info info;
    CHECK_OK(mapping_device_get_info(dev, &info));
    CHECK(strcmp(info.backend, test_backend()) == 0);
    CHECK(strcmp(mapping_backend_name(dev), test_backend()) == 0);
    CHECK(info.name[0] != '\0' && info.kind[0] != '\0');
    CHECK(info.memory_bytes > 0);
    mapping_device_info listed[16];
    int count = 0;
    CHECK_OK(mapping_list_devices(test_backend(), listed, 16, &count));
    CHECK(count >= 1);
    CHECK(strcmp(listed[0].name, info.name) == 0);
}

TEST(native_buffer_handles_are_distinct_and_stable)
{
    mapping_device *dev = test_device();
    mapping_buffer *a, *b;
    CHECK_OK(mapping_allocate_gpu(dev, 128, &a));
    CHECK_OK(mapping_allocate_gpu(dev, 128, &b));
    void *na = NULL, *nb = NULL, *na2 = NULL;
    CHECK_OK(mapping_buffer_native(a, &na));
    CHECK_OK(mapping_buffer_native(b, &nb));
    CHECK_OK(mapping_buffer_native(a, &na2));
    CHECK(na != NULL && na != nb && na == na2);
    mapping_native_device nd;
    CHECK_OK(mapping_device_native(dev, &nd));
    if (strcmp(test_backend(), "host") != 0)
        CHECK(nd.context != NULL);
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    void *ns = (void *)1;
    CHECK_OK(mapping_stream_native(s, &ns));
    if (strcmp(test_backend(), "host") != 0)
        CHECK(ns != NULL);
    mapping_stream_destroy(s);
    mapping_free_gpu(a);
    mapping_free_gpu(b);
}

TEST(link_is_measured_once_and_can_be_set)
{
    mapping_device *dev = test_device();
    mapping_stats before, after;
    CHECK_OK(mapping_device_stats(dev, &before));
    mapping_link link;
    CHECK_OK(mapping_device_link(dev, &link));
    CHECK(link.latency > 0 && link.latency < 1.0);
    CHECK(link.bandwidth > 1e6);
    CHECK_OK(mapping_device_stats(dev, &after));
    CHECK(after.h2d_copies == before.h2d_copies); /* measuring is not the user's traffic */
    mapping_link set = {.latency = 2e-6, .bandwidth = 10e9};
    CHECK_OK(mapping_device_set_link(dev, &set));
    CHECK_OK(mapping_device_link(dev, &link));
    CHECK(link.latency == 2e-6 && link.bandwidth == 10e9);
    mapping_link bad = {.latency = -1, .bandwidth = 1};
    CHECK_STATUS(mapping_device_set_link(dev, &bad), MAPPING_ERR_INVALID_ARGUMENT);
}

TEST(statistics_count_every_transfer)
{
    mapping_device *dev = test_device();
    mapping_device_stats_reset(dev);
    unsigned char host[1000] = {0};
    mapping_buffer *a, *b;
    CHECK_OK(mapping_allocate_gpu(dev, 1000, &a));
    CHECK_OK(mapping_allocate_gpu(dev, 1000, &b));
    CHECK_OK(mapping_sync_to_gpu(host, a));
    CHECK_OK(mapping_sync_to_gpu_range(NULL, host, a, 10, 90));
    CHECK_OK(mapping_sync_to_cpu_range(NULL, a, 0, host, 300));
    CHECK_OK(mapping_copy_gpu(NULL, a, 0, b, 0, 400));
    CHECK_OK(mapping_fill_gpu(NULL, b, 0, 50, 1));
    CHECK_STATUS(mapping_sync_to_gpu_range(NULL, host, a, 999, 2), MAPPING_ERR_OUT_OF_RANGE); /* not counted */
    mapping_stats s;
    CHECK_OK(mapping_device_stats(dev, &s));
    CHECK(s.h2d_copies == 2 && s.h2d_bytes == 1090);
    CHECK(s.d2h_copies == 1 && s.d2h_bytes == 300);
    CHECK(s.d2d_copies == 1 && s.d2d_bytes == 400);
    CHECK(s.fills == 1 && s.fill_bytes == 50);
    char json[1024];
    size_t needed = 0;
    CHECK_OK(mapping_device_stats_json(dev, json, sizeof json, &needed));
    CHECK(needed == strlen(json));
    CHECK(strstr(json, "\"h2d_bytes\":1090") != NULL);
    CHECK(strstr(json, "\"d2h_copies\":1") != NULL);
    char small[8];
    CHECK_OK(mapping_device_stats_json(dev, small, sizeof small, &needed)); /* cut, NUL-terminated */
    CHECK(strlen(small) == sizeof small - 1 && needed > sizeof small);
    CHECK(s.blocking_ns == 0); /* small copies are not timed */
    mapping_buffer *big;
    unsigned char *big_host = calloc(1, 1 << 17);
    CHECK_OK(mapping_allocate_gpu(dev, 1 << 17, &big));
    CHECK_OK(mapping_sync_to_gpu(big_host, big));
    CHECK_OK(mapping_device_stats(dev, &s));
    CHECK(s.blocking_ns > 0);
    mapping_free_gpu(big);
    free(big_host);
    mapping_device_stats_reset(dev);
    CHECK_OK(mapping_device_stats(dev, &s));
    CHECK(s.h2d_bytes == 0 && s.d2h_copies == 0 && s.blocking_ns == 0);
    mapping_free_gpu(a);
    mapping_free_gpu(b);
}

TEST(close_frees_what_the_caller_left_behind)
{
    /* Leaks are cleaned up (and reported through the log callback); under
     * AddressSanitizer a leak here fails the test. */
    mapping_device *dev;
    mapping_device_desc desc = {.backend = test_backend()};
    (void)test_device(); /* SKIP when absent */
    CHECK_OK(mapping_open(&desc, &dev));
    mapping_buffer *buf;
    mapping_stream *s;
    void *pinned;
    CHECK_OK(mapping_allocate_gpu(dev, 4096, &buf));
    CHECK_OK(mapping_allocate_cpu(dev, 4096, &pinned));
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_sync_to_gpu_range(s, pinned, buf, 0, 4096));
    mapping_event *ev;
    CHECK_OK(mapping_event_record(s, &ev));
    mapping_close(dev);
}
