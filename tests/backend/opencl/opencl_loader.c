/*
 * Loading OpenCL at run time: a missing library, or one without the entry
 * points, makes the back end unavailable with the reason, never a crash.
 * Each test runs in its own process, so the override is seen by the one load.
 */
#include <stdlib.h>
#include "harness.h"

static mapping_backend_info opencl_info(void)
{
    mapping_backend_info all[8];
    int n = 0;
    CHECK_OK(mapping_list_backends(all, 8, &n));
    for (int i = 0; i < n && i < 8; i++)
        if (strcmp(all[i].name, "opencl") == 0) {
            if (!all[i].compiled || strstr(all[i].reason, "without the OpenCL headers"))
                test_skip("the OpenCL back end is not compiled into this build: %s", all[i].reason);
            return all[i];
        }
    test_fail(__FILE__, __LINE__, "mapping_list_backends does not list opencl");
}

static void check_unavailable_with(const char *library, const char *reason_part)
{
    setenv("MAPPING_OPENCL_LIBRARY", library, 1);
    mapping_backend_info info = opencl_info();
    CHECK(!info.available);
    CHECK(info.device_count == 0);
    if (!strstr(info.reason, reason_part))
        test_fail(__FILE__, __LINE__, "reason \"%s\" does not mention \"%s\"", info.reason, reason_part);

    mapping_device *dev = NULL;
    CHECK_STATUS(mapping_open(&(mapping_device_desc){.backend = "opencl"}, &dev), MAPPING_ERR_NO_BACKEND);
    CHECK(dev == NULL);
    CHECK(strstr(mapping_last_error_message(), reason_part) != NULL);
    int count = -1;
    CHECK_OK(mapping_list_devices("opencl", NULL, 0, &count));
    CHECK(count == 0);

    /* The rest of the library is unaffected. */
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = "host"}, &dev));
    mapping_close(dev);
}

UNIT_TEST(opencl_missing_library_makes_the_back_end_unavailable_with_the_reason)
{
    check_unavailable_with("/nonexistent/libOpenCL.so.1", "/nonexistent/libOpenCL.so.1");
}

UNIT_TEST(opencl_library_without_the_entry_points_is_unavailable_naming_one)
{
    /* A real shared library that is not OpenCL. */
    check_unavailable_with("libm.so.6", "clGetPlatformIDs");
}
