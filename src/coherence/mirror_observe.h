/*
 * What a mirror sync reports, and the debug check of unmarked writes: the
 * one-line hooks mirror_sync.c and mirror.c call.
 *
 * - mapping__mirror_sync_done: after every sync (also one that found
 *   nothing stale): a trace event (os/trace.h) and an info-level log line
 *   with the ranges stale, the copies made of them (merged), the bytes moved
 *   and skipped; and, in the debug mode below, a new snapshot of the pages.
 * - MAPPING_CHECK=unmarked (mirror_check.c): before a sync to the GPU, the
 *   host bytes outside the marked ranges are compared, page by page, with a
 *   hash taken at the previous sync; a change is an error (MAPPING_ERR_CONFLICT)
 *   naming the pages. Costs one hash pass over the view (several GB/s) per
 *   sync and 9 bytes per 4 KiB page, so it is for debugging only.
 */
#ifndef MAPPING_COHERENCE_MIRROR_OBSERVE_H
#define MAPPING_COHERENCE_MIRROR_OBSERVE_H

#include "coherence/mirror_internal.h"
#include "os/trace.h"

/* What one sync of [lo, hi) to side t did. */
typedef struct mirror_sync_report {
    size_t stale_ranges; /* exact stale ranges found */
    size_t copies;       /* ranges copied after merging neighbours */
    size_t moved;        /* bytes copied (merged gaps included) */
    size_t skipped;      /* bytes of the view not copied */
} mirror_sync_report;

/* MAPPING_CHECK, read once: 0 not read yet, 1 no check, 2 unmarked, 3 a
 * value that is no check (every sync to the GPU then fails, saying so). */
extern _Atomic int mapping__mirror_check_mode __attribute__((visibility("hidden")));
/* Whether MAPPING_CHECK asks for the check (reads it the first time). */
bool mapping__mirror_check_enabled(void);
static inline bool mapping__mirror_check_on(void)
{
    int mode = atomic_load_explicit(&mapping__mirror_check_mode, memory_order_relaxed);
    if (__builtin_expect(mode == 1, 1))
        return false;
    return mode != 0 || mapping__mirror_check_enabled() ||
           atomic_load_explicit(&mapping__mirror_check_mode, memory_order_relaxed) == 3;
}

void mapping__mirror_report_sync(const mapping_trace_span *span, mapping_stream *stream, const mapping_mirror *m,
                                 int t, mirror_sync_report report, mapping_status status);
/* After every sync: the report (tracing or a log callback) and the check's
 * snapshot (MAPPING_CHECK=unmarked). Off, a few predicted branches. */
static inline void mapping__mirror_sync_done(const mapping_trace_span *span, mapping_stream *stream,
                                             const mapping_mirror *m, int t, mirror_sync_report report,
                                             mapping_status status)
{
    if (__builtin_expect(span->t0 != 0, 0) || mapping__mirror_check_on() || mapping__log_enabled())
        mapping__mirror_report_sync(span, stream, m, t, report, status);
}

/* MAPPING_CHECK=unmarked: MAPPING_OK, or MAPPING_ERR_CONFLICT naming the
 * pages of [lo, hi) whose host bytes changed outside marked ranges since the
 * last sync. Nothing when the mode is off. */
mapping_status mapping__mirror_check_pages(const char *fn, mirror_state *st, size_t lo, size_t hi);
static inline mapping_status mapping__mirror_check_unmarked(const char *fn, mirror_state *st, size_t lo, size_t hi)
{
    return mapping__mirror_check_on() ? mapping__mirror_check_pages(fn, st, lo, hi) : MAPPING_OK;
}
/* Hashes the pages of [lo, hi) that are valid on the CPU (mode on only). */
void           mapping__mirror_check_snapshot(mirror_state *st, size_t lo, size_t hi);
/* Forgets the family's hashes (when its state is freed). */
void           mapping__mirror_check_forget(const mirror_state *st);

#endif
