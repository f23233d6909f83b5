/* A device name that is not UTF-8 (a driver's Latin-1 or garbage) still
 * gives valid JSON in the statistics JSON and in the trace: each bad byte
 * becomes \ufffd (src/os/json.h). The name is planted in a host device's
 * info, as a driver would report it. */
#include <unistd.h>
#include "harness.h"
#include "testing/test_hooks.h"

static const char BAD_NAME[] = "caf\xe9 \xff\xfe gpu \xc3";

/* Whether text is well-formed UTF-8 without raw control characters other
 * than newlines (what a JSON parser accepts outside strings, too). */
static bool valid_json_text(const unsigned char *t)
{
    while (*t) {
        if (*t < 0x20 && *t != '\n')
            return false;
        size_t n = *t < 0x80 ? 1 : (*t & 0xe0) == 0xc0 ? 2 : (*t & 0xf0) == 0xe0 ? 3 : (*t & 0xf8) == 0xf0 ? 4 : 0;
        if (n == 0 || (n == 2 && *t < 0xc2) || (n == 4 && *t > 0xf4))
            return false;
        for (size_t i = 1; i < n; i++)
            if ((t[i] & 0xc0) != 0x80)
                return false;
        t += n;
    }
    return true;
}

static mapping_device *device_with_bad_name(void)
{
    mapping_device *dev;
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = "host"}, &dev));
    snprintf(dev->info.name, sizeof dev->info.name, "%s", BAD_NAME);
    return dev;
}

UNIT_TEST(stats_json_of_a_device_with_a_non_utf8_name_is_valid_json)
{
    mapping_device *dev = device_with_bad_name();
    char json[8192];
    CHECK_OK(mapping_device_stats_json(dev, json, sizeof json, NULL));
    if (!valid_json_text((const unsigned char *)json))
        test_fail(__FILE__, __LINE__, "not valid JSON text: %s", json);
    CHECK(strstr(json, "caf\\ufffd \\ufffd\\ufffd gpu \\ufffd") != NULL);
    mapping_close(dev);
}

UNIT_TEST(trace_of_a_device_with_a_non_utf8_name_is_valid_json)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/mapping_trace_utf8_%d.json", (int)getpid());
    CHECK_OK(mapping_trace_start(path));
    mapping_device *dev = device_with_bad_name();
    mapping_buffer *buf;
    char host[32] = {0};
    CHECK_OK(mapping_allocate_gpu(dev, sizeof host, &buf));
    CHECK_OK(mapping_sync_to_gpu(host, buf));
    mapping_free_gpu(buf);
    mapping_close(dev);
    CHECK_OK(mapping_trace_stop());
    static char text[1 << 20];
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    remove(path);
    text[n] = '\0';
    CHECK(n > 0 && n < sizeof text - 1);
    if (!valid_json_text((const unsigned char *)text))
        test_fail(__FILE__, __LINE__, "the trace is not valid JSON text");
    CHECK(strstr(text, "caf\\ufffd \\ufffd\\ufffd gpu \\ufffd") != NULL);
}
