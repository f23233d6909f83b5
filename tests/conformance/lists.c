/* The lists in mapping.h: MAPPING_CAP_LIST generates the capability names
 * (the stats JSON keys from MAPPING_STATS_LIST: tests/internal/stats_json.c). */
#include "harness.h"

TEST(capability_names_come_from_the_cap_list)
{
    unsigned all = 0;
    int entries = 0;
#define CHECK_CAP_(name, bit, label)                                        \
    CHECK(MAPPING_CAP_##name == 1u << (bit));                               \
    CHECK((all & MAPPING_CAP_##name) == 0); /* each bit once */             \
    all |= MAPPING_CAP_##name;                                              \
    CHECK(mapping_capability_name(MAPPING_CAP_##name) != NULL);             \
    CHECK(strcmp(mapping_capability_name(MAPPING_CAP_##name), label) == 0); \
    entries++;
    MAPPING_CAP_LIST(CHECK_CAP_)
#undef CHECK_CAP_
    CHECK(entries == 10);
    CHECK(strcmp(mapping_capability_name(MAPPING_CAP_PINNED_HOST), "pinned-host") == 0);
    CHECK(strcmp(mapping_capability_name(MAPPING_CAP_LINK_MODEL), "link-model") == 0);
    CHECK(strcmp(mapping_capability_name(MAPPING_CAP_CPU_MEMORY), "cpu-memory") == 0);
    CHECK(mapping_capability_name((mapping_capability)0) == NULL);
    CHECK(mapping_capability_name((mapping_capability)(MAPPING_CAP_UNIFIED | MAPPING_CAP_TIMING)) == NULL);
    CHECK(mapping_capability_name((mapping_capability)(1u << 20)) == NULL);

    /* A device reports only listed capabilities. */
    mapping_device *dev = test_device();
    mapping_device_info info;
    CHECK_OK(mapping_device_get_info(dev, &info));
    CHECK((info.caps & ~all) == 0);
}

/* Capabilities, not back-end names, tell the layers above what a device is:
 * cpu-memory where device memory is the CPU's own (host, OpenCL CPU
 * devices), link-model exactly where a modelled link was asked for. */
TEST(capabilities_say_where_device_memory_lives_and_whether_a_link_is_modelled)
{
    mapping_device *dev = test_device();
    mapping_device_info info;
    CHECK_OK(mapping_device_get_info(dev, &info));
    int cpu_kind = strcmp(info.kind, "host") == 0 || strcmp(info.kind, "cpu") == 0;
    CHECK(((info.caps & MAPPING_CAP_CPU_MEMORY) != 0) == cpu_kind);

    if (strcmp(test_backend(), "host") != 0 || getenv("MAPPING_HOST_LINK"))
        return; /* only the host back end models a link */
    mapping_device_desc desc = {.backend = "host"};
    CHECK_OK(mapping_open(&desc, &dev));
    CHECK_OK(mapping_device_get_info(dev, &info));
    CHECK((info.caps & MAPPING_CAP_LINK_MODEL) == 0);
    mapping_close(dev);
    desc.link_bandwidth = 25e9;
    desc.link_latency = 5e-6;
    CHECK_OK(mapping_open(&desc, &dev));
    CHECK_OK(mapping_device_get_info(dev, &info));
    CHECK((info.caps & MAPPING_CAP_LINK_MODEL) != 0);
    mapping_close(dev);
}
