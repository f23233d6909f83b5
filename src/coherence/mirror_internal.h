/*
 * Internals of mirrors, shared by mirror.c (objects, views, marking),
 * mirror_sync.c (stale ranges, merging, the copy step), mirror_inflight.c
 * (queued copies the state follows), mirror_access.c
 * (acquire/release) and mirror_unified.c.
 *
 * Side indices: 0 = CPU, 1 = GPU (mapping_side - 1).
 *
 * State invariants (over the whole family, absolute offsets):
 * - stale[0] and stale[1] are disjoint: no byte is stale on both sides.
 * - modified[x] ⊆ stale[1 - x] once every in-flight copy has been folded:
 *   modified bytes of x are exactly the stale bytes of the other side that
 *   were made stale by a mark (not the GPU side's initial staleness).
 * - pending[t] ⊆ stale[t]: ranges whose copy to t is queued; they stay stale
 *   until the copy's event completes and the entry is folded.
 */
#ifndef MAPPING_MIRROR_INTERNAL_H
#define MAPPING_MIRROR_INTERNAL_H

#include "coherence/range_set.h"
#include "core/ops.h"
#include "transfer/transfer.h"

enum { MIRROR_CPU = 0, MIRROR_GPU = 1, MIRROR_ACCESS = -1 };

/* Queued work touching the family: a copy (target = side index; folds its
 * ranges into the state when complete) or the caller's own device work
 * between acquire_gpu and release_gpu (target = MIRROR_ACCESS; orders only). */
typedef struct mirror_inflight {
    mapping_event  *event;
    mapping_stream *stream; /* compared, never dereferenced */
    size_t          lo, hi; /* span the work touches, merged gaps included */
    int             target;
    mapping_range  *ranges; /* exact ranges that become valid on target */
    size_t          n;
} mirror_inflight;

typedef struct mirror_state {
    mapping_device *dev;
    uint64_t        dev_serial; /* dev->serial when created */
    /* mapping__handle_removals_any() when the device was last found open:
     * while it stands, the device still is (no lookup per call). */
    uint64_t        dev_checked_removals;
    size_t          size;
    unsigned char  *cpu;
    mapping_buffer *gpu;
    bool            owns_cpu; /* from mapping_allocate_cpu (create), not wrapped */
    bool            unified;  /* cpu is the host address of gpu's unified memory */
    bool            pinned;   /* wrapped memory registered with mapping__host_register */
    bool            borrowed_gpu; /* mapping_mirror_adopt: gpu is the caller's, never freed here */
    bool            cpu_writable; /* wrapped memory found writable (the first copy into it asks, mirror_sync.c) */
    size_t          gpu_base;     /* byte 0 of the family lies at gpu[gpu_base] (adopt) */
    int             refs;     /* handles of the family */
    bool            busy;     /* a sync is running: re-entry (from the log callback) is refused */

    mapping_range_set stale[2], modified[2], pending[2];

    mirror_inflight *inflight;
    size_t           n_inflight, cap_inflight;

    mapping_batch *batch; /* many-range syncs go through it; made on first need */

    /* Marks not yet applied to the range sets (mirror_mark_log.c): all of
     * side log_side, appended in a few ns; the sets see them at the next
     * flush, which every reader and writer of the sets calls first. */
    mapping_range *log;
    size_t         log_n, log_cap;
    mapping_range *log_scratch; /* the sort's second array, log_cap entries when set (kept: no fresh pages per sort) */
    size_t         log_sorted; /* log[0, log_sorted) is sorted, disjoint and not touching (the last compaction's) */
    bool           log_unsorted; /* false: all of the log is (appends in order) */
    int            log_side;

    /* MAPPING_MIRROR_TRACK_WRITES: the CPU side's pages under watch
     * (mirror_track.c); NULL when not tracked. */
    struct mapping_track_region *track;

    /* MAPPING_MIRROR_DEVICE_DIFF (mirror_diff.c): a device-side shadow of
     * the content both sides agreed on, over diff_known; made on first need. */
    bool               diff, diff_pays, diff_used;
    mapping_buffer    *diff_shadow, *diff_flags;
    unsigned char     *diff_host_flags;
    mapping_range_set  diff_known;
    double             diff_rate; /* bytes per second the device compared; 0: not measured */
} mirror_state;

struct mapping_mirror {
    mirror_state *st;
    size_t        offset, size; /* absolute position of this handle in the family */
};

/* ---- mirror.c ---- */
mapping_status mapping__mirror_check(const char *fn, const mapping_mirror *m);
/* Marks side x modified over [lo, hi) (absolute). The caller ordered queued
 * work first. discard: drop the other side's unsynced modifications there
 * instead of reporting a conflict. All-or-nothing. */
mapping_status mapping__mirror_mark(const char *fn, mirror_state *st, int x, size_t lo, size_t hi, bool discard);

/* ---- mirror_mark_log.c ---- */
/* The log is compacted from this many marks on (see mirror_mark_log.c). */
enum { MIRROR_LOG_MIN_COMPACT = 1 << 17 };
bool mapping__mirror_log_append_slow(mirror_state *st, int x, size_t lo, size_t hi);
/* Appends a mark of side x over [lo, hi) to the log when that is exact: no
 * queued work to order, no modification of the other side to conflict with,
 * and the log holds marks of x only. False: mark the slow way. Inline for
 * the common cases (a mark apart from the previous one, or extending it
 * upwards, with room and no compaction due); the rest in
 * mirror_mark_log.c. */
static inline bool mapping__mirror_log_append(mirror_state *st, int x, size_t lo, size_t hi)
{
    if (st->n_inflight || st->modified[1 - x].count || (st->log_n && st->log_side != x))
        return false;
    size_t n = st->log_n;
    if (n && n < st->log_cap && !(n >= MIRROR_LOG_MIN_COMPACT && n >= 2 * st->log_sorted)) {
        mapping_range *last = &st->log[n - 1];
        if (lo > last->hi || hi < last->lo) { /* apart from the previous mark */
            if (lo < last->lo)
                st->log_unsorted = true;
            st->log[n] = (mapping_range){lo, hi};
            st->log_n = n + 1;
            return true;
        }
        if (lo >= last->lo) { /* touches it, from its start on: one range */
            if (hi > last->hi)
                last->hi = hi;
            return true;
        }
    }
    return mapping__mirror_log_append_slow(st, x, lo, hi);
}
/* Sorts the log by lo and merges ranges that overlap or touch (its tail
 * only, then merged with the part already sorted); the log and its scratch
 * may swap. Out of memory: nothing changes. */
mapping_status mapping__mirror_log_sort(mirror_state *st);
/* Applies the logged marks to the range sets (sorted and merged first). */
mapping_status mapping__mirror_log_apply(mirror_state *st);
static inline mapping_status mapping__mirror_log_flush(mirror_state *st)
{
    return st->log_n ? mapping__mirror_log_apply(st) : MAPPING_OK;
}
void           mapping__mirror_log_free(mirror_state *st);

/* ---- mirror_inflight.c: queued work the state follows ---- */
/* Folds every in-flight entry whose event has completed. */
void           mapping__mirror_fold_completed(mirror_state *st);
/* Orders the caller after queued work touching [lo, hi): with stream NULL it
 * waits (and folds); otherwise it chains `stream` on work of other streams,
 * except entries whose target is wait_target, which it waits for. */
mapping_status mapping__mirror_order(mirror_state *st, mapping_stream *stream, size_t lo, size_t hi, int wait_target);
/* Records the end of queued work on stream over [lo, hi) as an in-flight
 * entry that folds nothing. */
mapping_status mapping__mirror_record_access(mirror_state *st, mapping_stream *stream, size_t lo, size_t hi);
/* Waits for everything (a failed wait is tried twice); folds nothing. Not OK
 * when some queued copy could not be waited for: it may still use the memory. */
mapping_status mapping__mirror_drain(mirror_state *st);
/* Makes the sorted ranges v[0..n) valid on side t (modifications of the
 * other side synced, no longer stale or queued); idempotent, redone later
 * when it fails part-way (out of memory). copied_now: the copy that wrote
 * them completed inside the current call, so on a tracked CPU side its
 * writes are forgotten here (mapping__mirror_track_copied); a copy on a
 * stream had them forgotten when it completed (mapping__mirror_track_copied_on). */
mapping_status mapping__mirror_apply_valid(mirror_state *st, int t, const mapping_range *v, size_t n, bool copied_now);
/* Room for one more in-flight entry. */
mapping_status mapping__mirror_inflight_reserve(mirror_state *st);
/* Records the current end of `stream` as an entry over [lo, hi) whose
 * ranges become valid on target when it completes (MIRROR_ACCESS: orders
 * only). Takes ownership of ranges on success only; room reserved first. */
mapping_status mapping__mirror_entry_push(mirror_state *st, mapping_stream *stream, size_t lo, size_t hi, int target,
                                          mapping_range *ranges, size_t n);

/* ---- mirror_sync.c ---- */
/* Copies the target's stale ranges of m (see mapping_mirror_sync_to_gpu). */
mapping_status mapping__mirror_sync(const char *fn, mapping_stream *stream, mapping_mirror *m, int target);
/* The copy step of a sync: moves each of ranges[0..n) (merged, absolute)
 * to side `target`, on stream. *done = how many were queued or done before
 * a failure. This is the one place a sync moves bytes, so a batching layer
 * can take over many-range syncs here. */
mapping_status mapping__mirror_copy_ranges(mapping_stream *stream, mirror_state *st, int target,
                                           const mapping_range *ranges, size_t n, size_t *done);

/* ---- mirror_track.c (MAPPING_MIRROR_TRACK_WRITES) ---- */
/* Starts watching st->cpu; MAPPING_ERR_UNSUPPORTED (recorded) when it cannot. */
mapping_status mapping__mirror_track_begin(const char *fn, mirror_state *st);
void           mapping__mirror_track_end(mirror_state *st);
/* Marks the pages written since the last collect modified on the CPU,
 * where the CPU side is valid. Every sync and stale count calls it first
 * (upload: a sync to the GPU, write_track.h). */
mapping_status mapping__mirror_track_collect_pages(const char *fn, mirror_state *st, bool upload);
static inline mapping_status mapping__mirror_track_collect(const char *fn, mirror_state *st, bool upload)
{
    return __builtin_expect(st->track != NULL, 0) ? mapping__mirror_track_collect_pages(fn, st, upload) : MAPPING_OK;
}
/* The library wrote these ranges of the CPU side (a copy from the device
 * that completed inside the current call): not the program's writes. */
void           mapping__mirror_track_copied(mirror_state *st, const mapping_range *v, size_t n);
/* The same for copies queued on stream: forgotten by a host function when
 * the stream gets there, before the program can know the copy is done and
 * write there (forgetting later, when the state folds the copy in, would
 * forget the program's writes made in between). Not OK when it could not
 * be queued: the caller then waits for the stream and uses
 * mapping__mirror_track_copied. */
mapping_status mapping__mirror_track_copied_on(mapping_stream *stream, mirror_state *st, const mapping_range *v,
                                               size_t n);
/* A mark of [lo, hi) on the CPU side: in mprotect mode its pages become
 * writable (a system call may write them; they count as written). */
void           mapping__mirror_track_marked(mirror_state *st, size_t lo, size_t hi);

/* ---- mirror_unified.c ---- */
/* Allocates unified memory for st (st->gpu, st->cpu) if the back end can;
 * MAPPING_ERR_UNSUPPORTED (not recorded) when it cannot. */
mapping_status mapping__mirror_alloc_unified(mirror_state *st);
/* The copy step of a unified mirror: a prefetch hint per range, or nothing. */
mapping_status mapping__mirror_prefetch(mapping_stream *stream, mirror_state *st, int target,
                                        const mapping_range *ranges, size_t n, size_t *done);

/* ---- mirror_diff.c (MAPPING_MIRROR_DEVICE_DIFF) ---- */
/* Tests: forces $MAPPING_DEVICE_DIFF (0 auto, 1 on, 2 off, 3 bad; -1 re-read). */
void mapping__mirror_diff_force_mode(int mode);
/* Turns the diff on for a new family; refuses a bad $MAPPING_DEVICE_DIFF. */
mapping_status mapping__mirror_diff_begin(const char *fn, mirror_state *st);
/* Frees the shadow (not when the device was closed: it took the buffers). */
void mapping__mirror_diff_end(mirror_state *st, bool device_closed);
/* The CPU side no longer equals the shadow over [lo, hi). */
mapping_status mapping__mirror_diff_forget(mirror_state *st, size_t lo, size_t hi);
/* A sync to the CPU of the exact stale ranges: *out (malloc'd, sorted,
 * disjoint) the ranges to read instead, the changed blocks and what the
 * shadow does not know; *out NULL: read exact as planned. Waits for the
 * stream up to the comparison. */
mapping_status mapping__mirror_diff_refine(mapping_stream *stream, mirror_state *st, const mapping_range *exact,
                                           size_t n, mapping_range **out, size_t *n_out);
/* After the copies of a sync to side t were done or queued (status). */
void mapping__mirror_diff_synced(mapping_stream *stream, mirror_state *st, int t, const mapping_range *exact,
                                 size_t n_exact, const mapping_range *copied, size_t n_copied, mapping_status status);

#endif
