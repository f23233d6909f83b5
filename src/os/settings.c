/*
 * The table of environment variables (settings.h) and the check every open
 * makes against it. Each row's rules are those of the code that reads the
 * variable (named in the comment before the row); docs/environment.md is
 * the table for people, and scripts/check_docs.py (lint.docs) keeps the
 * three in step: every variable the code reads is a row here, and every
 * row here is a row there. The lint reads each row's first line, so keep
 * it as {"NAME", S(KIND), "words" or NULL, ...}. tests/unit/settings.c
 * gives every row bogus and good values of its own.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "os/os.h"
#include "os/settings.h"
#include "os/status.h"

#define S(kind) MAPPING_SETTING_##kind
#define TIB ((unsigned long long)1 << 40)

/* clang-format off */
static const mapping_setting table[] = {
    /* core/device.c (mapping_open), tools/, bench/ */
    {"MAPPING_BACKEND", S(WORDS), "host,opencl,cuda", 0, 0, "host, opencl or cuda",
     "the best available: CUDA, then an OpenCL GPU or accelerator, then host",
     "the back end that mapping_open(NULL) opens"},
    /* core/device.c: decimal digits, at most 1000000 */
    {"MAPPING_DEVICE", S(COUNT), NULL, 0, 1000000, "decimal digits, 0 to 1000000", "0",
     "the device index that mapping_open(NULL) opens"},
    /* backend/host/host.c host_load */
    {"MAPPING_HOST_DEVICES", S(COUNT), NULL, 1, 64, "decimal digits, 1 to 64", "1",
     "the host back end's virtual devices, each with its own memory"},
    /* backend/host/host.c link_from_env (os/link.c's rules) */
    {"MAPPING_HOST_LINK", S(LINK), NULL, 0, 0,
     "BANDWIDTH[,LATENCY] as plain numbers in bytes/s and seconds, e.g. 25e9,5e-6 (no units); "
     "bandwidth 0 or 1e3 to 1e15, latency 0 to 1",
     "no modelled link", "makes the host back end model a link (a copy takes latency + bytes / bandwidth)"},
    /* core/budget.c mapping__budget_from_env (mapping_open, mapping_open_opencl) */
    {"MAPPING_MEMORY_BUDGET", S(COUNT), NULL, 0, 1ull << 60, "decimal digits, 0 to 2^60 (bytes)", "no budget",
     "the memory budget of every device opened without one in its desc (0: none)"},
    /* backend/host/host.c poison_from_env */
    {"MAPPING_HOST_POISON", S(WORDS), "0,1", 0, 0, "0 or 1", "1 in Debug builds, else 0",
     "whether the host back end fills new device memory with 0xCD"},
    /* core/device.c batch_map_from_env */
    {"MAPPING_BATCH_MAP", S(WORDS), "0,1", 0, 0, "0 or 1", "1",
     "0: blocking batches on a device whose memory is the CPU's pack and scatter instead of mapping"},
    /* os/copy_pool.c mapping_os_copy_threads_from_env */
    {"MAPPING_COPY_THREADS", S(COUNT), NULL, 0, 64, "decimal digits, 0 to 64", "half the online CPUs less one, at most 5",
     "helper threads that share the memcpy of large staged copies of pageable memory"},
    /* backend/cuda/cuda.c scatter_mode_from_env */
    {"MAPPING_CUDA_SCATTER", S(WORDS), "auto,batch,kernel,copies", 0, 0, "auto, batch, kernel or copies", "auto",
     "how the CUDA back end scatters a batch on the device"},
    /* backend/opencl/opencl.c opencl_device_open, opencl_peer.c sharing_enabled */
    {"MAPPING_OPENCL_SHARED_CONTEXT", S(WORDS), "0,1", 0, 0, "0 or 1", "1",
     "1: an OpenCL platform's devices share one context; 0: one context per device"},
    /* backend/opencl/opencl.c diff_shape_from_env */
    {"MAPPING_OPENCL_DIFF", S(WORDS), "auto,items,groups", 0, 0, "auto, items or groups", "auto",
     "the shape of the OpenCL diff kernel (auto: items on CPU devices, groups elsewhere)"},
    /* os/dl.c mapping_os_dlopen_first (backend/cuda/cuda_loader.c) */
    {"MAPPING_CUDA_LIBRARY", S(PATH), NULL, 0, 0, "a path for dlopen", "libcuda.so.1, then libcuda.so",
     "the CUDA driver library to load; one that does not load makes cuda unavailable, with the reason"},
    /* os/dl.c mapping_os_dlopen_first (backend/opencl/opencl_loader.c) */
    {"MAPPING_OPENCL_LIBRARY", S(PATH), NULL, 0, 0, "a path for dlopen", "libOpenCL.so.1, then libOpenCL.so",
     "the OpenCL ICD loader to load; one that does not load makes opencl unavailable, with the reason"},
    /* tools/device_details.c open_driver */
    {"MAPPING_NVML_LIBRARY", S(PATH), NULL, 0, 0, "a path for dlopen", "libnvidia-ml.so.1, then libnvidia-ml.so",
     "mapping info only: NVML, for a CUDA device's PCIe link; one that does not load leaves the link out"},
    /* os/cache_file.c mapping_os_cache_path */
    {"MAPPING_CACHE_DIR", S(PATH), "off", 0, 0, "a directory, or off", "$XDG_CACHE_HOME/mapping, else ~/.cache/mapping",
     "where compiled device kernels are kept between processes (off: nowhere)"},
    /* os/trace.c start_from_environment */
    {"MAPPING_TRACE", S(PATH), NULL, 0, 0, "a file path (one that cannot be created fails mapping_open)", "no trace",
     "records a trace timeline for Perfetto into this file, written at exit"},
    /* os/trace.c max_events_from_env */
    {"MAPPING_TRACE_MAX_EVENTS", S(COUNT), NULL, 0, 1000000000000ull, "decimal digits, 0 (no limit) to 10^12",
     "1000000", "the most events a trace keeps in memory; the newest replace the oldest"},
    /* coherence/mirror_check.c read_environment, track/race_guard.c mapping__race_mode_read */
    {"MAPPING_CHECK", S(LIST), "unmarked,races", 0, 0, "a comma-separated list of unmarked and races", "no check",
     "unmarked: host writes never marked; races: CPU accesses that race an asynchronous copy"},
    /* track/write_track.c choose */
    {"MAPPING_TRACK", S(WORDS), "auto,uffd,mprotect,none", 0, 0, "auto, uffd, mprotect or none", "auto",
     "the write-tracking mechanism of MAPPING_MIRROR_TRACK_WRITES"},
    /* track/write_track.c mapping_track_scan_mode */
    {"MAPPING_TRACK_SCAN", S(WORDS), "faulted,changed,always", 0, 0, "faulted, changed or always", "faulted",
     "with uffd, how a sync finds the written pages"},
    /* track/write_track.c mapping_track_streams */
    {"MAPPING_TRACK_STREAMS", S(BYTES), "on,off", 0, TIB,
     "on, off, or a byte count in decimal digits: a power of two from 4 pages to 2^40", "on (8 MiB)",
     "with uffd, the size from which a run written at every sync stays writable"},
    /* track/fault_count.c set_up */
    {"MAPPING_TRACK_FAULT_ENTRIES", S(WORDS), "on,off", 0, 0, "on or off", "on",
     "off: with uffd, do not count the faults every thread begins (perf), as where perf refuses"},
    /* track/write_track_mprotect.c install */
    {"MAPPING_TRACK_TEST_OPEN_DELAY_US", S(COUNT), NULL, 0, 1000000, "decimal digits, 0 to 1000000", "0",
     "tests only: microseconds the mprotect handler waits between opening a page and recording it"},
    /* coherence/mirror_diff.c mode */
    {"MAPPING_DEVICE_DIFF", S(WORDS), "auto,on,off", 0, 0, "auto, on or off", "auto",
     "whether MAPPING_MIRROR_DEVICE_DIFF mirrors compare on the device before a sync to the CPU"},
};
/* clang-format on */

const mapping_setting *mapping_os_settings(size_t *count)
{
    *count = sizeof table / sizeof table[0];
    return table;
}

const mapping_setting *mapping_os_setting_find(const char *name)
{
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(table[i].name, name))
            return &table[i];
    return NULL;
}

/* Whether [word, word + n) is one of the comma-separated `words`. */
static bool is_word(const char *words, const char *word, size_t n)
{
    for (const char *w = words; w && *w;) {
        size_t len = strcspn(w, ",");
        if (len == n && !strncmp(w, word, n))
            return true;
        w += len + (w[len] == ',');
    }
    return false;
}

/* Decimal digits only: 0 with the value in *out, -1 when not digits, 1
 * when above cap (no overflow: the reading stops there). */
static int read_digits(const char *v, unsigned long long cap, unsigned long long *out)
{
    unsigned long long n = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9')
            return -1;
        if (n <= cap)
            n = n * 10 + (unsigned long long)(*c - '0');
    }
    *out = n;
    return n > cap ? 1 : 0;
}

/* The loop of mirror_check.c and race_guard.c: items end at a comma, and
 * a comma at the very end ends the list. */
static const char *list_refusal(const mapping_setting *s, const char *v)
{
    for (const char *p = v; *p;) {
        size_t n = strcspn(p, ",");
        if (!is_word(s->words, p, n))
            return n ? "an item is not one of the accepted words" : "an item is empty";
        p += n + (p[n] == ',');
    }
    return NULL;
}

static const char *count_refusal(const mapping_setting *s, const char *v)
{
    unsigned long long n;
    int rc = read_digits(v, s->max, &n);
    return rc < 0 ? "not decimal digits" : rc > 0 || n < s->min ? "out of range" : NULL;
}

static const char *bytes_refusal(const mapping_setting *s, const char *v)
{
    unsigned long long n;
    if (is_word(s->words, v, strlen(v)))
        return NULL;
    int rc = read_digits(v, s->max, &n);
    if (rc < 0)
        return "neither one of the accepted words nor decimal digits";
    if (rc > 0 || n < 4 * (unsigned long long)mapping_os_page_size())
        return "out of range";
    return n & (n - 1) ? "not a power of two" : NULL;
}

/* backend/host/host.c's reading: a number, then optionally a comma and a
 * number, then the end. */
static const char *link_refusal(const char *v)
{
    double bandwidth = 0, latency = 0;
    const char *end;
    if (!mapping_os_parse_double(v, ",", &end, &bandwidth) ||
        (*end == ',' && !mapping_os_parse_double(end + 1, NULL, NULL, &latency)))
        return "not BANDWIDTH[,LATENCY] as plain numbers";
    return mapping_os_link_check(bandwidth, latency);
}

const char *mapping_os_setting_refusal(const mapping_setting *s, const char *value)
{
    switch (s->kind) {
    case MAPPING_SETTING_WORDS:
        return is_word(s->words, value, strlen(value)) ? NULL : "not one of the accepted words";
    case MAPPING_SETTING_LIST:
        return list_refusal(s, value);
    case MAPPING_SETTING_COUNT:
        return count_refusal(s, value);
    case MAPPING_SETTING_BYTES:
        return bytes_refusal(s, value);
    case MAPPING_SETTING_LINK:
        return link_refusal(value);
    case MAPPING_SETTING_PATH:
        return NULL;
    }
    return "a kind of setting this library does not know";
}

/* The value as a message shows it: at most 80 bytes, control characters as '?'. */
static void shown_value(const char *v, char *out, size_t size)
{
    size_t n = 0, len = strlen(v);
    for (; n < len && n < 80 && n + 4 < size; n++)
        out[n] = (unsigned char)v[n] < 0x20 || v[n] == 0x7f ? '?' : v[n];
    if (n < len && n + 4 < size) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
}

mapping_status mapping__settings_check(const char *fn)
{
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const mapping_setting *s = &table[i];
        const char *v = getenv(s->name), *why;
        if (!v || !*v || !(why = mapping_os_setting_refusal(s, v)))
            continue;
        char shown[96];
        shown_value(v, shown, sizeof shown);
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: %s=\"%s\" is refused (%s); accepted: %s; unset or empty: %s",
                             fn, s->name, shown, why, s->accepted, s->unset);
    }
    return MAPPING_OK;
}
