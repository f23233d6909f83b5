/* MAPPING_HOST_DEVICES=0 is a bad value like any other: mapping_open of the
 * default back end fails naming it, instead of silently opening OpenCL
 * (where PoCL is installed) as it did. Each test runs in its own process, so
 * the host back end loads here for the first time, with the value set. */
#include <stdlib.h>
#include "harness.h"

UNIT_TEST(host_devices_zero_fails_the_default_open_naming_the_variable)
{
    unsetenv("MAPPING_BACKEND");
    unsetenv("MAPPING_DEVICE");
    setenv("MAPPING_HOST_DEVICES", "0", 1);
    mapping_device *dev = (mapping_device *)1;
    mapping_status st = mapping_open(NULL, &dev);
    if (st == MAPPING_OK)
        test_fail(__FILE__, __LINE__, "mapping_open(NULL) opened %s", mapping_backend_name(dev));
    CHECK(strstr(mapping_last_error_message(), "MAPPING_HOST_DEVICES=\"0\"") != NULL);
    CHECK_STATUS(mapping_open(&(mapping_device_desc){.backend = "host"}, &dev), st);
    /* Other back ends stay usable when asked for by name. */
    mapping_backend_info infos[8];
    int n = 0;
    CHECK_OK(mapping_list_backends(infos, 8, &n));
    CHECK(n >= 1 && !strcmp(infos[0].name, "host") && !infos[0].available);
}
