/*
 * What a mirror sync reports (mirror_observe.c): after every sync (also one
 * that found nothing stale), a trace event (os/trace.h) and an info-level
 * log line with the ranges stale, the copies made of them (merged), the
 * bytes moved and skipped. Off, a few predicted branches.
 */
#ifndef MAPPING_COHERENCE_MIRROR_OBSERVE_H
#define MAPPING_COHERENCE_MIRROR_OBSERVE_H

#include "coherence/mirror_state.h"
#include "os/trace.h"

/* What one sync of [lo, hi) to side t did. */
typedef struct mirror_sync_report {
    size_t stale_ranges; /* exact stale ranges found */
    size_t copies;       /* ranges copied after merging neighbours */
    size_t moved;        /* bytes copied (merged gaps included) */
    size_t skipped;      /* bytes of the view not copied */
} mirror_sync_report;

void mapping__mirror_report_sync(const mapping_trace_span *span, mapping_stream *stream, const mapping_mirror *m,
                                 int t, mirror_sync_report report, mapping_status status);
static inline void mapping__mirror_sync_done(const mapping_trace_span *span, mapping_stream *stream,
                                             const mapping_mirror *m, int t, mirror_sync_report report,
                                             mapping_status status)
{
    if (__builtin_expect(span->t0 != 0, 0) || mapping__log_enabled())
        mapping__mirror_report_sync(span, stream, m, t, report, status);
}

#endif
