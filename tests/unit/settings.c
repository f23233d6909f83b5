/*
 * The environment is checked at every open against one table
 * (os/settings.c): each variable, given a bogus value, makes mapping_open
 * (and mapping_open_opencl) fail with MAPPING_ERR_INVALID_ARGUMENT and a
 * message naming the variable and its accepted values; given a good value,
 * the open succeeds. The values below are this test's own, not the table's,
 * and every row of the table must have a case here (and every case a row).
 * Each open runs in a forked child, which starts with none of the table's
 * variables set but the one under test (and MAPPING_BACKEND=host), so what
 * the library reads once per process (the trace, the host back end's device
 * count, ...) is read afresh.
 */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "os/settings.h"

enum { MAX_VALUES = 16 };

typedef struct setting_case {
    const char *name;
    const char *bad[MAX_VALUES];  /* refused at open (NULL-terminated) */
    const char *good[MAX_VALUES]; /* accepted: mapping_open of host succeeds */
} setting_case;

static char trace_path[128]; /* a file that can be created, for MAPPING_TRACE's good value */

static const setting_case cases[] = {
    {"MAPPING_BACKEND", {"HOST", "bogus", "host ", " host", "cuda,host", "gpu"}, {"host"}},
    {"MAPPING_DEVICE", {"abc", "-1", " 0", "+0", "0x1", "1e3", "0 ", "1000001", "99999999999999999999", "1.0"},
     {"0", "00"}},
    {"MAPPING_HOST_DEVICES", {"0", "65", "x", "-1", "2 ", "1.5"}, {"1", "2", "64"}},
    {"MAPPING_MEMORY_BUDGET", {"1G", "-1", "0x100", " 5", "1e9", "1152921504606846977"}, {"0", "1048576", "1073741824"}},
    {"MAPPING_HOST_LINK", {"garbage", "nan,nan", "25GB/s", "25e9,", ",5e-6", "25e9,5e-6,1", "inf", "1e-300",
                           "25e9,1e12", " 25e9", "-1", "0x10"},
     {"25e9,5e-6", "25e9", "1000000000,0.000002", "0"}},
    {"MAPPING_HOST_POISON", {"yes", "2", "1 ", "on"}, {"0", "1"}},
    {"MAPPING_BATCH_MAP", {"yes", "2", "0 ", "off", "true"}, {"0", "1"}},
    {"MAPPING_COPY_THREADS", {"-1", "65", "2 ", " 2", "two", "0x2", "1e1", "+1"}, {"0", "2", "64"}},
    {"MAPPING_CUDA_SCATTER", {"bogus", "Auto", "kernel,batch", "auto "}, {"auto", "batch", "kernel", "copies"}},
    {"MAPPING_OPENCL_SHARED_CONTEXT", {"yes", "2", "0 ", "off"}, {"0", "1"}},
    {"MAPPING_OPENCL_DIFF", {"warps", "Items", "auto,items"}, {"auto", "items", "groups"}},
    {"MAPPING_CUDA_LIBRARY", {NULL}, {"/nonexistent/libcuda.so.1", "libcuda.so.1"}},    /* cuda_loading.c */
    {"MAPPING_OPENCL_LIBRARY", {NULL}, {"/nonexistent/libOpenCL.so.1", "libOpenCL.so.1"}}, /* opencl_loader.c */
    {"MAPPING_NVML_LIBRARY", {NULL}, {"/nonexistent/libnvidia-ml.so.1"}},
    {"MAPPING_CACHE_DIR", {NULL}, {"off", "/nonexistent/mapping-cache"}},
    {"MAPPING_TRACE", {"/nonexistent-dir/x/trace.json"}, {trace_path}},
    {"MAPPING_TRACE_MAX_EVENTS", {"lots", "5x", "-1", " 5", "1e6", "0x10", "1000000000001"},
     {"0", "50", "1000000000000"}},
    {"MAPPING_CHECK", {"unmarkd", "races,bogus", ",races", "races,,unmarked", "RACES", "races "},
     {"unmarked", "races", "unmarked,races", "races,unmarked", "races,"}},
    {"MAPPING_TRACK", {"bogus", "UFFD", " auto", "uffd,mprotect", "off"}, {"auto", "uffd", "mprotect", "none"}},
    {"MAPPING_TRACK_SCAN", {"sometimes", "Faulted", "always "}, {"faulted", "changed", "always"}},
    {"MAPPING_TRACK_STREAMS", {"sometimes", "4095", "3", "12345678", "1099511627777", "2199023255552", "-8388608",
                               "8M", "ON"},
     {"on", "off", "8388608", "1099511627776"}},
    {"MAPPING_TRACK_FAULT_ENTRIES", {"bogus", "OFF", "0", "no"}, {"on", "off"}},
    {"MAPPING_TRACK_TEST_OPEN_DELAY_US", {"5x", "-1", "1000001", "1e3", " 5"}, {"0", "500", "1000000"}},
    {"MAPPING_DEVICE_DIFF", {"sometimes", "ON", "1", "auto "}, {"auto", "on", "off"}},
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

typedef struct child_result {
    mapping_status status;
    char           message[512];
} child_result;

/* In a child with only `name`=`value` of the table's variables set (and
 * MAPPING_BACKEND=host): mapping_open(NULL), or mapping_open_opencl. */
static child_result open_in_child(const char *name, const char *value, bool adopt)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        size_t n;
        const mapping_setting *rows = mapping_os_settings(&n);
        for (size_t i = 0; i < n; i++)
            unsetenv(rows[i].name);
        setenv("MAPPING_BACKEND", "host", 1);
        setenv(name, value, 1);
        mapping_device *dev = NULL;
        child_result r = {0};
        r.status = adopt ? mapping_open_opencl((void *)1, (void *)1, NULL, &dev) : mapping_open(NULL, &dev);
        snprintf(r.message, sizeof r.message, "%s", r.status ? mapping_last_error_message() : "");
        _exit(write(fds[1], &r, sizeof r) == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fds[1]);
    child_result r = {MAPPING_OK, ""};
    ssize_t got = read(fds[0], &r, sizeof r);
    close(fds[0]);
    int wstatus = 0;
    CHECK(waitpid(pid, &wstatus, 0) == pid);
    if (got != (ssize_t)sizeof r || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
        test_fail(__FILE__, __LINE__, "the child opening with %s=\"%s\" died (status 0x%x)", name, value, wstatus);
    return r;
}

static const setting_case *case_of(const char *name)
{
    for (size_t i = 0; i < N_CASES; i++)
        if (!strcmp(cases[i].name, name))
            return &cases[i];
    return NULL;
}

static void check_refused(const mapping_setting *row, const char *value)
{
    child_result r = open_in_child(row->name, value, false);
    char named[64];
    snprintf(named, sizeof named, "%s=", row->name);
    if (r.status != MAPPING_ERR_INVALID_ARGUMENT || !strstr(r.message, named) ||
        (row->kind != MAPPING_SETTING_PATH && (!strstr(r.message, "accepted: ") || !strstr(r.message, value))))
        test_fail(__FILE__, __LINE__, "mapping_open with %s=\"%s\": %s, \"%s\" (expected INVALID_ARGUMENT naming the "
                  "variable, the value and what it accepts)", row->name, value, mapping_status_name(r.status),
                  r.message);
    if (row->kind != MAPPING_SETTING_PATH && !mapping_os_setting_refusal(row, value))
        test_fail(__FILE__, __LINE__, "the table accepts %s=\"%s\"", row->name, value);
}

static void check_accepted(const mapping_setting *row, const char *value)
{
    if (mapping_os_setting_refusal(row, value))
        test_fail(__FILE__, __LINE__, "the table refuses %s=\"%s\": %s", row->name, value,
                  mapping_os_setting_refusal(row, value));
    child_result r = open_in_child(row->name, value, false);
    if (r.status != MAPPING_OK)
        test_fail(__FILE__, __LINE__, "mapping_open with %s=\"%s\": %s, \"%s\"", row->name, value,
                  mapping_status_name(r.status), r.message);
}

UNIT_TEST(every_setting_refuses_a_bogus_value_at_open_naming_it_and_opens_with_a_good_one)
{
    char dir[] = "/tmp/mapping-settings-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    snprintf(trace_path, sizeof trace_path, "%s/trace.json", dir);
    size_t n_rows;
    const mapping_setting *rows = mapping_os_settings(&n_rows);
    for (size_t i = 0; i < N_CASES; i++)
        if (!mapping_os_setting_find(cases[i].name))
            test_fail(__FILE__, __LINE__, "%s has a case here but no row in os/settings.c", cases[i].name);
    int refused = 0, accepted = 0;
    for (size_t i = 0; i < n_rows; i++) {
        const setting_case *c = case_of(rows[i].name);
        if (!c)
            test_fail(__FILE__, __LINE__, "%s (os/settings.c) has no case in tests/unit/settings.c", rows[i].name);
        if (!c->bad[0] && rows[i].kind != MAPPING_SETTING_PATH)
            test_fail(__FILE__, __LINE__, "%s: no bogus value to try", rows[i].name);
        for (const char *const *v = c->bad; *v; v++, refused++)
            check_refused(&rows[i], *v);
        for (const char *const *v = c->good; *v; v++, accepted++)
            check_accepted(&rows[i], *v);
        remove(trace_path);
    }
    CHECK(rmdir(dir) == 0);
    printf("%zu settings: %d bogus values refused at mapping_open, %d good values opened\n", n_rows, refused,
           accepted);
}

/* The other way to open a device checks the same table, before it looks at
 * the handles it is given (here made up: they are never read). */
UNIT_TEST(mapping_open_opencl_checks_the_settings_too)
{
    child_result r = open_in_child("MAPPING_TRACK", "bogus", true);
    if (r.status != MAPPING_ERR_INVALID_ARGUMENT || !strstr(r.message, "mapping_open_opencl: MAPPING_TRACK=\"bogus\""))
        test_fail(__FILE__, __LINE__, "mapping_open_opencl with MAPPING_TRACK=bogus: %s, \"%s\"",
                  mapping_status_name(r.status), r.message);
}

/* A message shows at most 80 bytes of the value, control characters as '?'. */
UNIT_TEST(a_refused_setting_is_shown_shortened_and_printable)
{
    char value[300];
    memset(value, 'x', sizeof value - 1);
    value[sizeof value - 1] = '\0';
    value[3] = '\n';
    child_result r = open_in_child("MAPPING_TRACK", value, false);
    CHECK(r.status == MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(r.message, "MAPPING_TRACK=\"xxx?xxxx") && strstr(r.message, "x...\" is refused"));
    CHECK(!strchr(r.message, '\n') && strlen(r.message) < 400);
}
