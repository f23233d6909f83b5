/* The numeric MAPPING_VERSION agrees with the three parts and with the
 * library's mapping_version() string. */
#include "harness.h"

UNIT_TEST(the_numeric_version_matches_the_string)
{
    CHECK(MAPPING_VERSION == MAPPING_VERSION_MAJOR * 10000 + MAPPING_VERSION_MINOR * 100 + MAPPING_VERSION_PATCH);
    int major = -1, minor = -1, patch = -1;
    CHECK(sscanf(mapping_version(), "%d.%d.%d", &major, &minor, &patch) == 3);
    CHECK(major * 10000 + minor * 100 + patch == MAPPING_VERSION);
    CHECK(minor < 100 && patch < 100); /* the encoding holds */
}
