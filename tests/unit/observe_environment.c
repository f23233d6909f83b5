/* MAPPING_TRACE and MAPPING_CHECK are read strictly: a trace file that
 * cannot be created fails mapping_open, and an unknown MAPPING_CHECK fails
 * every mirror sync to the GPU, each with a message naming the variable.
 * (Each is read once per process: each test runs in its own.) */
#include <stdlib.h>
#include "harness.h"

UNIT_TEST(mapping_trace_naming_a_file_that_cannot_be_created_fails_mapping_open)
{
    setenv("MAPPING_TRACE", "/nonexistent-dir/x/trace.json", 1);
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev = (mapping_device *)&desc;
    CHECK_REFUSED(mapping_open(&desc, &dev), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(dev == NULL);
    CHECK(strstr(mapping_last_error_message(), "MAPPING_TRACE=/nonexistent-dir/x/trace.json") != NULL);
    CHECK_REFUSED(mapping_open(&desc, &dev), MAPPING_ERR_INVALID_ARGUMENT); /* every time */
    CHECK(!mapping_trace_active());
}

UNIT_TEST(mapping_check_with_an_unknown_value_fails_syncs_to_the_gpu)
{
    setenv("MAPPING_CHECK", "unmarkd", 1);
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    CHECK_OK(mapping_open(&desc, &dev));
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, 4096, 0, &m));
    CHECK_REFUSED(mapping_mirror_sync_to_gpu(NULL, m), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), "MAPPING_CHECK=unmarkd") != NULL);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m)); /* nothing to check there */
    mapping_mirror_destroy(m);
    mapping_close(dev);
}
