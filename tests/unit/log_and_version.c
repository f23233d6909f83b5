/* The library as a whole, once on the host back end: the log
 * callback hears errors, and the version matches the header. */
#include "harness.h"

typedef struct log_record {
    int  count;
    int  level;
    char last[256];
} log_record;

static void record_log(int level, const char *message, void *user)
{
    log_record *r = user;
    r->count++;
    r->level = level;
    snprintf(r->last, sizeof r->last, "%s", message);
}

UNIT_TEST(the_log_callback_hears_errors_and_version_is_stable)
{
    char expected[32];
    snprintf(expected, sizeof expected, "%d.%d.%d", MAPPING_VERSION_MAJOR, MAPPING_VERSION_MINOR,
             MAPPING_VERSION_PATCH);
    CHECK(strcmp(mapping_version(), expected) == 0); /* the library matches its header */
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    CHECK_OK(mapping_open(&desc, &dev));
    log_record r = {0};
    mapping_set_log(record_log, &r);
    mapping_buffer *buf;
    CHECK_STATUS(mapping_allocate_gpu(dev, 0, &buf), MAPPING_ERR_ZERO_SIZE);
    CHECK(r.count == 1 && r.level == 0);
    CHECK(strstr(r.last, "mapping_allocate_gpu") != NULL);
    CHECK(strcmp(r.last, mapping_last_error_message()) == 0);
    mapping_set_log(NULL, NULL); /* silent again */
    CHECK_STATUS(mapping_allocate_gpu(dev, 0, &buf), MAPPING_ERR_ZERO_SIZE);
    CHECK(r.count == 1);
    mapping_close(dev);
}
