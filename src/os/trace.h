/*
 * The trace recorder: a timeline of what the library did, written as Chrome
 * Trace Event JSON (Perfetto and chrome://tracing open it). It lives at the
 * bottom of the stack, like the log in os/status.h, so that every layer may
 * record: core/ops.c its driver calls (through core/trace_hooks.h), the
 * transfer layer its batch flushes and pipeline chunks, the coherence layer
 * its mirror syncs. The public start/stop functions are in observe/trace.c.
 *
 * Cost when tracing is off: mapping__trace_begin() reads one relaxed atomic
 * flag and MAPPING_TRACE_END tests the span it returned; both branches are
 * predicted not taken. When on: two clock reads, a mutex and a copy of the
 * record into an array that grows up to $MAPPING_TRACE_MAX_EVENTS events,
 * then replaces the oldest (counted as dropped); the JSON is written at stop
 * or exit.
 *
 * Tracks: each device is a process (pid), named after the device; its
 * blocking calls (stream NULL) are thread 0, "blocking calls", and each
 * stream is a thread of its own ("stream 1", ...). An event on a stream
 * spans the time to queue the work, not the device's time.
 */
#ifndef MAPPING_OS_TRACE_H
#define MAPPING_OS_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "os/os.h"
#include "os/status.h"

/* Hidden: read without a GOT load in the library's position-independent code. */
extern _Atomic bool mapping__trace_active __attribute__((visibility("hidden")));

/* The start of something to trace: t0 == 0 when tracing is off. */
typedef struct mapping_trace_span {
    uint64_t t0;
} mapping_trace_span;

static inline mapping_trace_span mapping__trace_begin(void)
{
    mapping_trace_span span = {0};
    if (__builtin_expect(atomic_load_explicit(&mapping__trace_active, memory_order_relaxed), 0))
        span.t0 = mapping_os_now_ns();
    return span;
}

enum { MAPPING_TRACE_MAX_ARGS = 8 };

/* One event. Strings are constants (or, for device_name, copied the first
 * time a device is seen); args with a NULL key end the list. */
typedef struct mapping_trace_record {
    const char    *name;        /* "write", "mirror sync", ... */
    const char    *cat;         /* "transfer", "device", "host", "mirror", "batch", "pipeline" */
    const void    *device;      /* the process: one per device */
    const char    *device_name; /* its label, "host: CPU (...)" */
    const void    *stream;      /* the track: NULL = blocking calls */
    const void    *buffer;      /* the device buffer, if any */
    const char    *direction;   /* "h2d", "d2h", "d2d" or NULL */
    mapping_status status;      /* not OK: the event carries its name */
    struct {
        const char *key;
        uint64_t    value;
    } args[MAPPING_TRACE_MAX_ARGS];
} mapping_trace_record;

/* Records span..now as one complete event. */
void mapping__trace_record(const mapping_trace_span *span, const mapping_trace_record *record);
/* An instant event (a mark on the timeline), if tracing. */
void mapping__trace_instant(const mapping_trace_record *record);

/* Records an event when the span was started with tracing on. */
#define MAPPING_TRACE_END(span, ...)                                                    \
    do {                                                                                \
        if (__builtin_expect((span).t0 != 0, 0))                                        \
            mapping__trace_record(&(span), &(mapping_trace_record){__VA_ARGS__});       \
    } while (0)

/* Starts recording into memory, to be written to path at
 * mapping__trace_stop or at exit. Decided under one lock: MAPPING_ERR_BUSY
 * while tracing; MAPPING_ERR_INVALID_ARGUMENT when no file can be made
 * there. Failures are recorded under fn. */
mapping_status mapping__trace_start(const char *fn, const char *path);
/* Stops recording and writes the file (a temporary beside it, renamed over
 * it): MAPPING_ERR_IO naming errno when it cannot be written, the file then
 * left as it was. MAPPING_OK also when not tracing. */
mapping_status mapping__trace_stop(void);
/* $MAPPING_TRACE=path starts tracing (once per process), written at exit.
 * MAPPING_ERR_INVALID_ARGUMENT, recorded under fn, when the file cannot be
 * created (every call says so). */
mapping_status mapping__trace_from_environment(const char *fn);

#endif
