/* MAPPING_TRACE and MAPPING_CHECK are read strictly: a trace file that
 * cannot be created fails mapping_open, and so does an unknown MAPPING_CHECK
 * (os/settings.c); one set only after the open fails every mirror sync to
 * the GPU. Each with a message naming the variable. (Each is read once per
 * process: each test runs in its own.) */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
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

UNIT_TEST(mapping_check_with_an_unknown_value_fails_mapping_open_and_syncs_to_the_gpu)
{
    setenv("MAPPING_CHECK", "unmarkd", 1);
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev = (mapping_device *)&desc;
    CHECK_REFUSED(mapping_open(&desc, &dev), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(dev == NULL && strstr(mapping_last_error_message(), "MAPPING_CHECK=\"unmarkd\"") != NULL);
    unsetenv("MAPPING_CHECK");
    CHECK_OK(mapping_open(&desc, &dev));
    setenv("MAPPING_CHECK", "unmarkd", 1); /* after the open: read at the first sync */
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, 4096, 0, &m));
    CHECK_REFUSED(mapping_mirror_sync_to_gpu(NULL, m), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), "MAPPING_CHECK=unmarkd") != NULL);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m)); /* nothing to check there */
    mapping_mirror_destroy(m);
    mapping_close(dev);
}

/* ---- the trace's bound: MAPPING_TRACE_MAX_EVENTS ---- */

static char *read_whole(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *s = malloc(cap);
    for (size_t got; s && (got = fread(s + len, 1, cap - len - 1, f)) > 0;) {
        len += got;
        if (len + 1 == cap) {
            char *t = realloc(s, cap *= 2);
            if (!t) {
                free(s);
                s = NULL;
            }
            s = t;
        }
    }
    fclose(f);
    if (s)
        s[len] = '\0';
    return s;
}

static int count_of(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* A number after `key` in s ("\"dropped_events\":"), or -1. */
static long long number_after(const char *s, const char *key)
{
    const char *p = strstr(s, key);
    return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

static char heard[4][512];
static int  heard_count;

static void hear_warnings(int level, const char *message, void *user)
{
    (void)user;
    if (level == 1 && heard_count < 4)
        snprintf(heard[heard_count++], sizeof heard[0], "%s", message);
}

/* n blocking 64-byte writes: n trace events. */
static void traced_writes(mapping_device *dev, int n)
{
    mapping_buffer *buf;
    char host[64] = {1};
    CHECK_OK(mapping_allocate_gpu(dev, sizeof host, &buf));
    for (int i = 0; i < n; i++)
        CHECK_OK(mapping_sync_to_gpu_range(NULL, host, buf, 0, sizeof host));
    mapping_free_gpu(buf);
}

/* Before: every event was kept (about 250 bytes each, no limit: a long
 * traced run grew without bound). Now at most MAPPING_TRACE_MAX_EVENTS, the
 * newest; the dropped ones are counted in the file and the log. */
UNIT_TEST(trace_keeps_at_most_mapping_trace_max_events_and_counts_the_dropped)
{
    char dir[] = "/tmp/mapping-trace-bound-XXXXXX", path[128];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    CHECK_OK(mapping_open(&desc, &dev));
    mapping_set_log(hear_warnings, NULL);

    setenv("MAPPING_TRACE_MAX_EVENTS", "50", 1);
    CHECK_OK(mapping_trace_start(path));
    traced_writes(dev, 300);
    CHECK_OK(mapping_trace_stop());
    char *s = read_whole(path);
    CHECK(s != NULL);
    CHECK(number_after(s, "\"max_events\":") == 50);
    CHECK(number_after(s, "\"events\":") == 50);
    CHECK(number_after(s, "\"dropped_events\":") >= 250); /* 300 writes and more */
    CHECK(count_of(s, "\"name\":\"trace events dropped\"") == 1);
    CHECK(count_of(s, "\"cat\":") == 50 + 1); /* the events kept, and the marker */
    CHECK(count_of(s, "\"name\":\"write\"") == 50); /* the newest: the last writes */
    CHECK(strcmp(s + strlen(s) - 3, "]}\n") == 0);
    free(s);
    CHECK(heard_count == 2);
    CHECK(strstr(heard[0], "50 events are kept in memory") && strstr(heard[0], "MAPPING_TRACE_MAX_EVENTS"));
    CHECK(strstr(heard[1], "events were dropped") && strstr(heard[1], path));

    /* 0: no limit. */
    heard_count = 0;
    setenv("MAPPING_TRACE_MAX_EVENTS", "0", 1);
    CHECK_OK(mapping_trace_start(path));
    traced_writes(dev, 300);
    CHECK_OK(mapping_trace_stop());
    CHECK((s = read_whole(path)) != NULL);
    CHECK(number_after(s, "\"dropped_events\":") == 0 && count_of(s, "\"name\":\"write\"") == 300);
    CHECK(!strstr(s, "trace events dropped") && heard_count == 0);
    free(s);

    /* Unset: the documented default. */
    unsetenv("MAPPING_TRACE_MAX_EVENTS");
    CHECK_OK(mapping_trace_start(path));
    traced_writes(dev, 3);
    CHECK_OK(mapping_trace_stop());
    CHECK((s = read_whole(path)) != NULL);
    CHECK(number_after(s, "\"max_events\":") == 1000000 && number_after(s, "\"dropped_events\":") == 0);
    free(s);

    /* Anything but decimal digits up to 1e12 is refused, naming the variable. */
    static const char *const bad[] = {"5x", "-1", " 5", "5 ", "1e6", "0x10", "1000000000001",
                                      "99999999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("MAPPING_TRACE_MAX_EVENTS", bad[i], 1);
        CHECK_REFUSED(mapping_trace_start(path), MAPPING_ERR_INVALID_ARGUMENT);
        CHECK(strstr(mapping_last_error_message(), "MAPPING_TRACE_MAX_EVENTS=") != NULL);
        CHECK(!mapping_trace_active());
    }
    unsetenv("MAPPING_TRACE_MAX_EVENTS");
    mapping_set_log(NULL, NULL);
    mapping_close(dev);
    remove(path);
    CHECK(rmdir(dir) == 0);
}

UNIT_TEST(mapping_trace_max_events_that_is_not_a_count_fails_mapping_open)
{
    char dir[] = "/tmp/mapping-trace-bound-XXXXXX", path[128];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    setenv("MAPPING_TRACE", path, 1);
    setenv("MAPPING_TRACE_MAX_EVENTS", "lots", 1);
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    CHECK_REFUSED(mapping_open(&desc, &dev), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), "MAPPING_TRACE_MAX_EVENTS=\"lots\"") != NULL);
    CHECK(!mapping_trace_active());
    CHECK(rmdir(dir) == 0); /* nothing was created */
}

/* Before: the message was cut at 512 bytes inside a long path, and the
 * reason (the part a user needs) was lost. */
UNIT_TEST(a_long_trace_path_is_shortened_in_messages_and_the_reason_kept)
{
    char path[3200];
    int n = snprintf(path, sizeof path, "/nonexistent-dir/");
    memset(path + n, 'a', 3000);
    snprintf(path + n + 3000, sizeof path - (size_t)n - 3000, "/trace.json");
    CHECK_REFUSED(mapping_trace_start(path), MAPPING_ERR_INVALID_ARGUMENT);
    const char *m = mapping_last_error_message();
    CHECK(strstr(m, "/nonexistent-dir/aaa") && strstr(m, "...") && strstr(m, "aaa/trace.json"));
    CHECK(strstr(m, strerror(ENOENT)) != NULL);

    setenv("MAPPING_TRACE", path, 1);
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    CHECK_REFUSED(mapping_open(&desc, &dev), MAPPING_ERR_INVALID_ARGUMENT);
    m = mapping_last_error_message();
    CHECK(strstr(m, "MAPPING_TRACE=/nonexistent-dir/aaa") && strstr(m, "aaa/trace.json"));
    CHECK(strstr(m, strerror(ENOENT)) != NULL);
}

/* Before: a program that starts a trace itself before its first
 * mapping_open, run with MAPPING_TRACE set, could never open a device
 * ("MAPPING_TRACE=...: cannot create the trace file: a trace is already
 * being recorded"), not even after stopping its trace. Now the program's
 * trace is recorded, MAPPING_TRACE is ignored with a warning in the log,
 * and mapping_open works. */
UNIT_TEST(mapping_trace_is_ignored_with_a_warning_when_the_program_traces_itself)
{
    char dir[] = "/tmp/mapping-trace-own-XXXXXX", mine[128], env[128];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(mine, sizeof mine, "%s/mine.json", dir);
    snprintf(env, sizeof env, "%s/env.json", dir);
    setenv("MAPPING_TRACE", env, 1);
    mapping_set_log(hear_warnings, NULL);
    CHECK_OK(mapping_trace_start(mine));
    mapping_clear_last_error();
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    CHECK_OK(mapping_open(&desc, &dev));
    CHECK(mapping_last_error() == MAPPING_OK); /* the refused start left nothing behind */
    CHECK(heard_count == 1 && strstr(heard[0], "MAPPING_TRACE=") && strstr(heard[0], "is ignored"));
    traced_writes(dev, 3);
    mapping_close(dev);
    CHECK_OK(mapping_trace_stop());
    CHECK_OK(mapping_open(&desc, &dev)); /* and after the stop */
    mapping_close(dev);
    mapping_set_log(NULL, NULL);
    char *s = read_whole(mine);
    CHECK(s && count_of(s, "\"name\":\"write\"") == 3);
    free(s);
    CHECK(access(env, F_OK) != 0);
    remove(mine);
    CHECK(rmdir(dir) == 0);
}
