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

void mapping__mirror_sync_done(const mapping_trace_span *span, mapping_stream *stream, const mapping_mirror *m, int t,
                               mirror_sync_report report, mapping_status status);

/* MAPPING_CHECK=unmarked: MAPPING_OK, or MAPPING_ERR_CONFLICT naming the
 * pages of [lo, hi) whose host bytes changed outside marked ranges since the
 * last sync. Nothing when the mode is off. */
mapping_status mapping__mirror_check_unmarked(const char *fn, mirror_state *st, size_t lo, size_t hi);
/* Hashes the pages of [lo, hi) that are valid on the CPU (mode on only). */
void           mapping__mirror_check_snapshot(mirror_state *st, size_t lo, size_t hi);
/* Forgets the family's hashes (when its state is freed). */
void           mapping__mirror_check_forget(const mirror_state *st);
/* Whether MAPPING_CHECK asks for the check (read once per process). */
bool           mapping__mirror_check_enabled(void);

#endif
