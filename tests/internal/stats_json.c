/* MAPPING_STATS_LIST generates the stats JSON keys; strings in the JSON are
 * escaped by the library's one writer (os/json.h, through the test hooks). */
#include "harness.h"
#include "testing/test_hooks.h"

TEST(stats_json_has_every_stats_list_key_in_order)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    unsigned char host[256] = {1};
    CHECK_OK(mapping_allocate_gpu(dev, sizeof host, &buf));
    CHECK_OK(mapping_sync_to_gpu(host, buf));
    CHECK_OK(mapping_sync_to_cpu(buf, host));
    CHECK_OK(mapping_fill_gpu(NULL, buf, 0, 16, 7));

    mapping_stats s;
    CHECK_OK(mapping_device_stats(dev, &s));
    char json[2048];
    size_t needed = 0;
    CHECK_OK(mapping_device_stats_json(dev, json, sizeof json, &needed));
    CHECK(needed == strlen(json));
    CHECK(json[0] == '{' && json[needed - 1] == '}');

    /* "backend" and "device" first, as escaped JSON strings. */
    mapping_device_info info;
    CHECK_OK(mapping_device_get_info(dev, &info));
    char key[640], value[512];
    snprintf(key, sizeof key, "{\"backend\":");
    mapping_json_string(value, sizeof value, info.backend);
    CHECK(strncmp(json, key, strlen(key)) == 0);
    CHECK(strncmp(json + strlen(key), value, strlen(value)) == 0);
    const char *at = json + strlen(key) + strlen(value);
    mapping_json_string(value, sizeof value, info.name);
    snprintf(key, sizeof key, ",\"device\":%s", value);
    CHECK(strncmp(at, key, strlen(key)) == 0);
    at += strlen(key);

    /* Then every counter, in list order, with the struct's value. */
    int fields = 0;
#define CHECK_KEY_(field)                                                                  \
    snprintf(key, sizeof key, ",\"" #field "\":%llu", (unsigned long long)s.field);        \
    if (strncmp(at, key, strlen(key)) != 0)                                                \
        test_fail(__FILE__, __LINE__, "expected %s at \"%s\" in %s", key, at, json);       \
    at += strlen(key);                                                                     \
    fields++;
    MAPPING_STATS_LIST(CHECK_KEY_)
#undef CHECK_KEY_
    CHECK(strcmp(at, "}") == 0);
    CHECK(fields * sizeof(uint64_t) == sizeof(mapping_stats)); /* one uint64_t per entry */
    CHECK(s.h2d_copies >= 1 && s.d2h_copies >= 1 && s.fills >= 1);

    mapping_free_gpu(buf);
}
