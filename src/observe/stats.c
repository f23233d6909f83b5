/* Statistics: a snapshot of the device's counters, as a struct or JSON. */
#include <stdio.h>
#include "core/core.h"

/* One list of fields: the struct, the counters and the JSON keys agree. */
#define MAPPING_STATS_FIELDS(X)                                                              \
    X(h2d_bytes, h2d_bytes) X(h2d_copies, h2d_copies) X(d2h_bytes, d2h_bytes)                \
    X(d2h_copies, d2h_copies) X(d2d_bytes, d2d_bytes) X(d2d_copies, d2d_copies)              \
    X(fill_bytes, fill_bytes) X(fills, fills) X(sync_skipped_bytes, sync_skipped_bytes)      \
    X(conflicts, conflicts) X(batch_flushes, batch_flushes) X(batch_copies, batch_copies)    \
    X(blocking_ns, blocking_ns)

mapping_status mapping_device_stats(const mapping_device *dev, mapping_stats *out)
{
    static const char fn[] = "mapping_device_stats";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    mapping_counters *c = (mapping_counters *)&dev->counters;
#define READ_(field, counter) out->field = atomic_load_explicit(&c->counter, memory_order_relaxed);
    MAPPING_STATS_FIELDS(READ_)
#undef READ_
    return MAPPING_OK;
}

void mapping_device_stats_reset(mapping_device *dev)
{
    if (mapping__check_device("mapping_device_stats_reset", dev) != MAPPING_OK)
        return;
#define RESET_(field, counter) atomic_store_explicit(&dev->counters.counter, 0, memory_order_relaxed);
    MAPPING_STATS_FIELDS(RESET_)
#undef RESET_
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
    char tmp[1024];
    int n = snprintf(tmp, sizeof tmp, "{\"backend\":\"%s\",\"device\":\"%s\"", dev->be->name, dev->info.name);
#define JSON_(field, counter) n += snprintf(tmp + n, sizeof tmp - (size_t)n, ",\"" #field "\":%llu", (unsigned long long)s.field);
    MAPPING_STATS_FIELDS(JSON_)
#undef JSON_
    n += snprintf(tmp + n, sizeof tmp - (size_t)n, "}");
    if (needed)
        *needed = (size_t)n;
    if (size > 0)
        snprintf(buf, size, "%s", tmp);
    return MAPPING_OK;
}
