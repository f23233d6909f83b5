/*
 * Trace hooks of core/ops.c: one call after each operation on a back end
 * records it (os/trace.h) when tracing is on, on the track of its stream of
 * its device. Off, each costs one predicted branch on the span.
 */
#ifndef MAPPING_CORE_TRACE_HOOKS_H
#define MAPPING_CORE_TRACE_HOOKS_H

#include "core/core.h"
#include "os/trace.h"

/* A transfer, fill or copy of `bytes` (direction NULL for a fill). */
static inline void mapping__trace_op(const mapping_trace_span *span, const char *name, const char *direction,
                                     mapping_device *dev, const mapping_stream *stream, const mapping_buffer *buf,
                                     size_t bytes, mapping_status st)
{
    MAPPING_TRACE_END(*span, .name = name, .cat = direction ? "transfer" : "device", .device = dev,
                      .device_name = dev->info.name, .stream = stream, .buffer = buf, .direction = direction,
                      .status = st, .args = {{"bytes", bytes}});
}

/* A scatter or gather: its entries, and their bytes. */
static inline void mapping__trace_table_op(const mapping_trace_span *span, const char *name, mapping_device *dev,
                                           const mapping_stream *stream, const mapping_buffer *buf,
                                           const mapping_scatter_entry *table, size_t count, mapping_status st)
{
    if (__builtin_expect(span->t0 == 0, 1))
        return;
    uint64_t bytes = 0;
    for (size_t k = 0; k < count; k++)
        bytes += table[k].bytes;
    MAPPING_TRACE_END(*span, .name = name, .cat = "transfer", .device = dev, .device_name = dev->info.name,
                      .stream = stream, .buffer = buf, .direction = "d2d", .status = st,
                      .args = {{"bytes", bytes}, {"entries", count}});
}

/* A host function queued on a stream (or run inline). */
static inline void mapping__trace_host_fn(const mapping_trace_span *span, mapping_device *dev,
                                          const mapping_stream *stream, mapping_status st)
{
    MAPPING_TRACE_END(*span, .name = "host function", .cat = "host", .device = dev, .device_name = dev->info.name,
                      .stream = stream, .status = st);
}

/* An instant event holding the device's transfer counters, so a trace can
 * be checked against the statistics: at close, and at a statistics reset. */
static inline void mapping__trace_statistics(mapping_device *dev, const char *what)
{
    if (__builtin_expect(!atomic_load_explicit(&mapping__trace_active, memory_order_relaxed), 1))
        return;
    const mapping_counters *c = &dev->counters;
#define MAPPING_TRACE_COUNTER_(field) {#field, atomic_load_explicit(&c->field, memory_order_relaxed)}
    mapping__trace_instant(&(mapping_trace_record){
        .name = what, .cat = "statistics", .device = dev, .device_name = dev->info.name,
        .args = {MAPPING_TRACE_COUNTER_(h2d_bytes), MAPPING_TRACE_COUNTER_(h2d_copies),
                 MAPPING_TRACE_COUNTER_(d2h_bytes), MAPPING_TRACE_COUNTER_(d2h_copies),
                 MAPPING_TRACE_COUNTER_(d2d_bytes), MAPPING_TRACE_COUNTER_(d2d_copies),
                 MAPPING_TRACE_COUNTER_(fill_bytes), MAPPING_TRACE_COUNTER_(fills)}});
#undef MAPPING_TRACE_COUNTER_
}

#endif
