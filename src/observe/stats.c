/* Statistics: a snapshot of the device's counters, as a struct or JSON. The
 * fields, the counters and the JSON keys all come from MAPPING_STATS_LIST. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "core/core.h"
#include "core/trace_hooks.h"
#include "os/json.h"

/* The layout of mapping_stats in 0.1.0: what the exported
 * mapping_device_stats writes, for programs that call it without the
 * header's sizing macro. Frozen: later counters are beyond it. */
enum { STATS_0_1_FIELDS = 15 };
#define COUNT_FIELD_(field) +1
_Static_assert(sizeof(mapping_stats) == (0 MAPPING_STATS_LIST(COUNT_FIELD_)) * sizeof(uint64_t),
               "mapping_stats: uint64_t fields only, no padding");
_Static_assert((0 MAPPING_STATS_LIST(COUNT_FIELD_)) >= STATS_0_1_FIELDS, "counters are appended, never removed");
#undef COUNT_FIELD_

mapping_status mapping_device_stats_sized(const mapping_device *dev, mapping_stats *out, size_t out_size)
{
    static const char fn[] = "mapping_device_stats";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    if (out_size == 0 || out_size % sizeof(uint64_t))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: out_size %zu is not the size of a mapping_stats (a non-zero multiple of 8)", fn,
                             out_size);
    mapping_stats s;
    mapping_counters *c = (mapping_counters *)&dev->counters;
#define READ_(field) s.field = atomic_load_explicit(&c->field, memory_order_relaxed);
    MAPPING_STATS_LIST(READ_)
#undef READ_
    /* Exactly out_size bytes: the caller's fields, zeros past ours. */
    size_t known = out_size < sizeof s ? out_size : sizeof s;
    memcpy(out, &s, known);
    memset((char *)out + known, 0, out_size - known);
    return MAPPING_OK;
}

mapping_status (mapping_device_stats)(const mapping_device *dev, mapping_stats *out)
{
    return mapping_device_stats_sized(dev, out, STATS_0_1_FIELDS * sizeof(uint64_t));
}

void mapping_device_stats_reset(mapping_device *dev)
{
    if (mapping__check_device("mapping_device_stats_reset", dev) != MAPPING_OK)
        return;
    mapping__trace_statistics(dev, "statistics reset");
#define RESET_(field) atomic_store_explicit(&dev->counters.field, 0, memory_order_relaxed);
    MAPPING_STATS_LIST(RESET_)
#undef RESET_
    /* A high-water mark starts again from what is resident now. */
    atomic_store_explicit(&dev->counters.peak_resident_bytes, atomic_load(&dev->resident), memory_order_relaxed);
}

/* Appends to the text in buf at *n, snprintf-style: what does not fit is
 * counted in *n but not written, and buf stays NUL-terminated. */
static void append(char *buf, size_t size, size_t *n, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t size, size_t *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(*n < size ? buf + *n : NULL, *n < size ? size - *n : 0, fmt, ap);
    va_end(ap);
    if (len > 0)
        *n += (size_t)len;
}

static void append_string(char *buf, size_t size, size_t *n, const char *s)
{
    *n += mapping_json_string(*n < size ? buf + *n : NULL, *n < size ? size - *n : 0, s);
}

mapping_status mapping_device_stats_json(const mapping_device *dev, char *buf, size_t size, size_t *needed)
{
    static const char fn[] = "mapping_device_stats_json";
    mapping_stats s;
    mapping_status st;
    if ((st = mapping_device_stats(dev, &s)))
        return st;
    if (!buf && size > 0)
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: buf is NULL with size %zu", fn, size);
    size_t n = 0;
    append(buf, size, &n, "{\"backend\":");
    append_string(buf, size, &n, dev->info.backend);
    append(buf, size, &n, ",\"device\":");
    append_string(buf, size, &n, dev->info.name);
#define JSON_(field) append(buf, size, &n, ",\"" #field "\":%llu", (unsigned long long)s.field);
    MAPPING_STATS_LIST(JSON_)
#undef JSON_
    append(buf, size, &n, "}");
    if (needed)
        *needed = n;
    return MAPPING_OK;
}
