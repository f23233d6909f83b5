/*
 * The bad-input table: every misuse gives a clear negative status (and a
 * message naming what was wrong), never a crash, and changes nothing. Stale
 * handles and injected driver faults: tests/internal/bad_input.c.
 */
#include <pthread.h>
#include "harness.h"

TEST(null_handles_and_pointers_are_refused)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    mapping_stream *s;
    unsigned char host[64] = {0};
    void *p;
    CHECK_OK(mapping_allocate_gpu(dev, 64, &buf));
    CHECK_OK(mapping_stream_create(dev, &s));

    CHECK_REFUSED(mapping_open(NULL, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_allocate_gpu(NULL, 64, &buf), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_allocate_gpu(dev, 64, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_allocate_cpu(NULL, 64, &p), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_allocate_cpu(dev, 64, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_sync_to_gpu(NULL, buf), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_sync_to_gpu(host, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_sync_to_cpu(NULL, host), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_sync_to_cpu(buf, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_sync_to_gpu_range(s, NULL, buf, 0, 8), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_sync_to_cpu_range(s, buf, 0, NULL, 8), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_copy_gpu(NULL, NULL, 0, buf, 0, 8), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_copy_gpu(NULL, buf, 0, NULL, 0, 8), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_fill_gpu(NULL, NULL, 0, 8, 0), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_stream_create(NULL, &s), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_stream_create(dev, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_stream_synchronize(NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_launch_host(s, NULL, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_event_record(NULL, (mapping_event **)&p), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_event_record(s, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_stream_wait_event(s, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_event_synchronize(NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_event_query(NULL), MAPPING_ERR_NULL_ARGUMENT);
    double seconds;
    CHECK_REFUSED(mapping_event_elapsed(NULL, NULL, &seconds), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_device_get_info(dev, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_device_get_info(NULL, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_buffer_native(NULL, &p), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_buffer_native(buf, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_stream_native(NULL, &p), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_device_native(dev, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_list_backends(NULL, 0, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_list_devices(NULL, NULL, 0, (int *)host), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_device_link(dev, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_device_set_link(dev, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_device_stats(dev, NULL), MAPPING_ERR_NULL_ARGUMENT);

    /* Destroy and free functions take NULL as a no-op, and name-returning
     * functions never return NULL. */
    mapping_clear_last_error();
    mapping_free_gpu(NULL);
    mapping_free_cpu(dev, NULL);
    mapping_stream_destroy(NULL);
    mapping_event_destroy(NULL);
    mapping_close(NULL);
    CHECK(mapping_last_error() == MAPPING_OK);
    CHECK(mapping_buffer_size(NULL) == 0);
    CHECK(strcmp(mapping_backend_name(NULL), "") == 0);
    CHECK(mapping_status_string((mapping_status)12345) != NULL);
    CHECK(mapping_status_string((mapping_status)-12345) != NULL);

    mapping_stream_destroy(s);
    mapping_free_gpu(buf);
}

TEST(zero_sizes_are_refused)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf, *none = (mapping_buffer *)1;
    void *p = (void *)1;
    unsigned char host[64];
    CHECK_OK(mapping_allocate_gpu(dev, 64, &buf));
    CHECK_REFUSED(mapping_allocate_gpu(dev, 0, &none), MAPPING_ERR_ZERO_SIZE);
    CHECK(none == NULL); /* out is cleared on failure */
    CHECK_REFUSED(mapping_allocate_cpu(dev, 0, &p), MAPPING_ERR_ZERO_SIZE);
    CHECK(p == NULL);
    CHECK_REFUSED(mapping_sync_to_gpu_range(NULL, host, buf, 0, 0), MAPPING_ERR_ZERO_SIZE);
    CHECK_REFUSED(mapping_sync_to_cpu_range(NULL, buf, 0, host, 0), MAPPING_ERR_ZERO_SIZE);
    CHECK_REFUSED(mapping_copy_gpu(NULL, buf, 0, buf, 32, 0), MAPPING_ERR_ZERO_SIZE);
    CHECK_REFUSED(mapping_fill_gpu(NULL, buf, 0, 0, 1), MAPPING_ERR_ZERO_SIZE);
    mapping_free_gpu(buf);
}

TEST(ranges_past_the_end_or_overflowing_are_refused_and_change_nothing)
{
    mapping_device *dev = test_device();
    enum { N = 256 };
    unsigned char base[N], host[N], out[N];
    test_pattern(base, N, 20);
    test_pattern(host, N, 21);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    CHECK_OK(mapping_sync_to_gpu(base, buf));
    const size_t huge = (size_t)-1;
    CHECK_REFUSED(mapping_sync_to_gpu_range(NULL, host, buf, 200, 57), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_sync_to_gpu_range(NULL, host, buf, 257, 1), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_sync_to_gpu_range(NULL, host, buf, 1, huge), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_sync_to_gpu_range(NULL, host, buf, huge, 2), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_sync_to_cpu_range(NULL, buf, 128, out, 129), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_sync_to_cpu_range(NULL, buf, huge - 10, out, 20), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_copy_gpu(NULL, buf, 0, buf, 200, 100), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_copy_gpu(NULL, buf, huge, buf, 0, 2), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_fill_gpu(NULL, buf, 255, 2, 0), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_fill_gpu(NULL, buf, 2, huge, 0), MAPPING_ERR_OUT_OF_RANGE);
    /* Overlapping ranges in one buffer. */
    CHECK_REFUSED(mapping_copy_gpu(NULL, buf, 0, buf, 10, 20), MAPPING_ERR_OVERLAP);
    CHECK_OK(mapping_sync_to_cpu(buf, out));
    CHECK_BYTES(out, base, N); /* nothing moved */
    mapping_free_gpu(buf);
}

TEST(free_cpu_refuses_pointers_it_did_not_allocate)
{
    mapping_device *dev = test_device();
    mapping_device *other = test_device2();
    unsigned char stack_bytes[64];
    void *heap = malloc(64), *pinned, *pinned_other;
    CHECK_OK(mapping_allocate_cpu(dev, 8192, &pinned));
    CHECK_OK(mapping_allocate_cpu(other, 64, &pinned_other));
    memset(pinned, 0x11, 8192);

    mapping_clear_last_error();
    mapping_free_cpu(dev, stack_bytes);
    CHECK(mapping_last_error() == MAPPING_ERR_NOT_OWNED);
    mapping_clear_last_error();
    mapping_free_cpu(dev, heap);
    CHECK(mapping_last_error() == MAPPING_ERR_NOT_OWNED);
    mapping_clear_last_error();
    mapping_free_cpu(dev, (char *)pinned + 16); /* inside, but not the start */
    CHECK(mapping_last_error() == MAPPING_ERR_NOT_OWNED);
    mapping_clear_last_error();
    mapping_free_cpu(dev, pinned_other); /* another device's */
    CHECK(mapping_last_error() == MAPPING_ERR_NOT_OWNED);
    mapping_clear_last_error();
    mapping_free_cpu(NULL, pinned);
    CHECK(mapping_last_error() == MAPPING_ERR_NULL_ARGUMENT);

    /* Nothing was freed: the memory is still there and still fast. */
    CHECK(((unsigned char *)pinned)[8191] == 0x11);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 8192, &buf));
    CHECK_OK(mapping_sync_to_gpu(pinned, buf));
    mapping_clear_last_error();
    mapping_free_cpu(dev, pinned);
    CHECK(mapping_last_error() == MAPPING_OK);
    mapping_free_cpu(dev, pinned); /* twice: the second is refused, not a double free */
    CHECK(mapping_last_error() == MAPPING_ERR_NOT_OWNED);
    mapping_free_cpu(other, pinned_other);
    mapping_free_gpu(buf);
    free(heap);
}

TEST(objects_of_two_devices_are_not_mixed)
{
    mapping_device *a = test_device();
    mapping_device *b = test_device2();
    CHECK(a != b);
    mapping_buffer *ba, *bb;
    mapping_stream *sa, *sb;
    unsigned char host[64] = {0};
    CHECK_OK(mapping_allocate_gpu(a, 64, &ba));
    CHECK_OK(mapping_allocate_gpu(b, 64, &bb));
    CHECK_OK(mapping_stream_create(a, &sa));
    CHECK_OK(mapping_stream_create(b, &sb));
    CHECK_REFUSED(mapping_sync_to_gpu_range(sb, host, ba, 0, 64), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK_REFUSED(mapping_sync_to_cpu_range(sa, bb, 0, host, 64), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK_REFUSED(mapping_copy_gpu(NULL, ba, 0, bb, 0, 64), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK_REFUSED(mapping_copy_gpu(sa, bb, 0, bb, 0, 1), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK_REFUSED(mapping_fill_gpu(sb, ba, 0, 64, 0), MAPPING_ERR_DEVICE_MISMATCH);
    mapping_event *ea;
    CHECK_OK(mapping_event_record(sa, &ea));
    CHECK_REFUSED(mapping_stream_wait_event(sb, ea), MAPPING_ERR_DEVICE_MISMATCH);
    mapping_event *eb;
    CHECK_OK(mapping_event_record(sb, &eb));
    double seconds;
    CHECK_OK(mapping_event_synchronize(ea));
    CHECK_OK(mapping_event_synchronize(eb));
    CHECK_REFUSED(mapping_event_elapsed(ea, eb, &seconds), MAPPING_ERR_DEVICE_MISMATCH);
    mapping_event_destroy(ea);
    mapping_event_destroy(eb);
    mapping_stream_destroy(sa);
    mapping_stream_destroy(sb);
    mapping_free_gpu(ba);
    mapping_free_gpu(bb);
}

TEST(unknown_back_ends_and_devices_are_refused)
{
    (void)test_device(); /* SKIP when this back end is absent */
    mapping_device *dev = (mapping_device *)1;
    mapping_device_desc desc = {.backend = "no-such-backend"};
    CHECK_REFUSED(mapping_open(&desc, &dev), MAPPING_ERR_NO_BACKEND);
    CHECK(dev == NULL);
    desc = (mapping_device_desc){.backend = test_backend(), .device = 100000};
    CHECK_REFUSED(mapping_open(&desc, &dev), MAPPING_ERR_NO_DEVICE);
    desc = (mapping_device_desc){.backend = test_backend(), .device = -1};
    CHECK_REFUSED(mapping_open(&desc, &dev), MAPPING_ERR_INVALID_ARGUMENT);
    int count;
    CHECK_REFUSED(mapping_list_devices("no-such-backend", NULL, 0, &count), MAPPING_ERR_NO_BACKEND);
    mapping_backend_info infos[2];
    CHECK_REFUSED(mapping_list_backends(NULL, 2, &count), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_list_backends(infos, -1, &count), MAPPING_ERR_INVALID_ARGUMENT);
}
