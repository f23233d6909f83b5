/*
 * The copy step of a sync (mirror_copy.c): the one place a sync moves bytes.
 * A list of ranges (sorted, disjoint, within the family) goes to side t as
 * one driver transfer each, or, from MIRROR_BATCH_MIN_RANGES on, through the
 * transfer layer's batches (packed into page-locked staging, one transfer,
 * a device-side scatter).
 */
#ifndef MAPPING_MIRROR_COPY_H
#define MAPPING_MIRROR_COPY_H

#include "coherence/mirror_state.h"

/* From this many ranges on, a sync packs them through the batch machinery:
 * one staged transfer and a device-side scatter instead of one driver
 * transfer per range. Below it, separate copies cost less than packing. */
enum { MIRROR_BATCH_MIN_RANGES = 16 };
/* In a batch another range costs a table entry and a few bytes of staging
 * alignment, not a transfer: only gaps about that small are worth copying. */
enum { MIRROR_BATCH_MERGE_GAP = 64 };

/* Does a sync of n ranges go through a batch? */
bool mapping__mirror_use_batch(const mirror_state *st, size_t n, const mapping_link *link);
/* Wrapped memory the first copy into the CPU side would write: refused
 * (MAPPING_ERR_INVALID_ARGUMENT) when it is read-only or not mapped. */
mapping_status mapping__mirror_check_cpu_writable(mirror_state *st, int t);
/* Copies ranges[0..n) to side t on stream (NULL: blocking); *done = how
 * many were queued or done before a failure. */
mapping_status mapping__mirror_copy_ranges(mapping_stream *stream, mirror_state *st, int t,
                                           const mapping_range *ranges, size_t n, size_t *done);
/* The same with the host bytes at host (the family's offsets) instead of
 * st->cpu: an upload from a snapshot (write tracking's shadow). */
mapping_status mapping__mirror_copy_ranges_from(mapping_stream *stream, mirror_state *st, int t,
                                                unsigned char *host, const mapping_range *ranges, size_t n,
                                                size_t *done);
/* A blocking copy through the batch of a list whose longest range is
 * `largest` bytes (the fast path's: the log, already sorted and merged). */
mapping_status mapping__mirror_send_sorted(mirror_state *st, int t, const mapping_range *list, size_t n,
                                           size_t largest);
/* The payload counters (mapping_stats): stale bytes a sync made valid. */
static inline void mapping__mirror_count_payload(mirror_state *st, int t, const mapping_range *v, size_t n)
{
    if (st->unified)
        return;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += v[i].hi - v[i].lo;
    mapping__count(t == MIRROR_GPU ? &st->dev->counters.h2d_payload_bytes : &st->dev->counters.d2h_payload_bytes,
                   bytes);
}

#endif
