/* A log callback that calls the library: the caller still reads its own
 * error afterwards, and the callback is not re-entered by failures of its
 * own calls (it would recurse until the stack overflows). */
#include "harness.h"

typedef struct reentrant_log {
    int depth, max_depth, calls;
    char heard[256];
} reentrant_log;

static void calling_log(int level, const char *message, void *user)
{
    (void)level;
    reentrant_log *r = user;
    r->calls++;
    if (r->depth == 0)
        snprintf(r->heard, sizeof r->heard, "%s", message);
    if (++r->depth > r->max_depth)
        r->max_depth = r->depth;
    if (r->depth < 3) /* bounded, so that a library without the guard fails here rather than crashing */
        mapping_stream_synchronize(NULL); /* fails: NULL_ARGUMENT, and would log */
    r->depth--;
}

UNIT_TEST(a_log_callback_that_calls_the_library_keeps_the_last_error_and_is_not_reentered)
{
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    CHECK_OK(mapping_open(&desc, &dev));
    reentrant_log r = {0};
    mapping_set_log(calling_log, &r);
    mapping_buffer *buf;
    CHECK_STATUS(mapping_allocate_gpu(dev, 0, &buf), MAPPING_ERR_ZERO_SIZE);
    mapping_set_log(NULL, NULL);
    CHECK(r.calls == 1 && r.max_depth == 1);
    CHECK(strstr(r.heard, "mapping_allocate_gpu") != NULL);
    /* The callback's own failure did not replace the caller's error. */
    CHECK(mapping_last_error() == MAPPING_ERR_ZERO_SIZE);
    CHECK(strstr(mapping_last_error_message(), "mapping_allocate_gpu") != NULL);
    mapping_close(dev);
}
