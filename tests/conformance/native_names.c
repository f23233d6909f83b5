/*
 * The native-handle getters under their object-first names
 * (mapping_device_native, mapping_buffer_native, mapping_stream_native) give
 * what the deprecated names (mapping_native_device_handles, _buffer, _stream)
 * give, and their errors name the function called.
 */
#include <string.h>
#include "harness.h"

static int named(const char *name)
{
    const char *msg = mapping_last_error_message();
    return strncmp(msg, name, strlen(name)) == 0 && msg[strlen(name)] == ':';
}

TEST(native_getters_object_first_names_match_the_old_ones)
{
    mapping_device *dev = test_device();
    mapping_native_device a, b;
    memset(&a, 0x11, sizeof a);
    memset(&b, 0x22, sizeof b);
    CHECK_OK(mapping_device_native(dev, &a));
    CHECK_OK(mapping_native_device_handles(dev, &b));
    CHECK(a.context == b.context && a.device == b.device && a.platform == b.platform && a.queue == b.queue);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 256, &buf));
    void *x = NULL, *y = (void *)&x;
    CHECK_OK(mapping_buffer_native(buf, &x));
    CHECK_OK(mapping_native_buffer(buf, &y));
    CHECK(x == y && x != NULL);
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    x = (void *)&y;
    y = (void *)&x;
    CHECK_OK(mapping_stream_native(s, &x));
    CHECK_OK(mapping_native_stream(s, &y));
    CHECK(x == y);
    mapping_stream_destroy(s);
    mapping_free_gpu(buf);
}

TEST(native_getters_errors_name_the_function_called)
{
    void *out;
    mapping_native_device nd;
    CHECK_REFUSED(mapping_device_native(NULL, &nd), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(named("mapping_device_native"));
    CHECK_REFUSED(mapping_native_device_handles(NULL, &nd), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(named("mapping_native_device_handles"));
    CHECK_REFUSED(mapping_buffer_native(NULL, &out), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(named("mapping_buffer_native"));
    CHECK_REFUSED(mapping_stream_native(NULL, &out), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(named("mapping_stream_native"));
    mapping_device *dev = test_device();
    CHECK_REFUSED(mapping_device_native(dev, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(named("mapping_device_native"));
}
