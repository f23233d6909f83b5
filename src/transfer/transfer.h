/*
 * The transfer layer's internals: batches (batch.c: queueing; batch_plan.c:
 * sorting and coalescing; batch_flush.c: running a plan; batch_staging.c: its
 * staging memory; pipeline.c) and the entry point the coherence layer uses
 * to move many ranges of one mirror (transfer_ranges.c).
 * The transfer layer sits on core (core/core.h, core/ops.h) and is used by
 * the coherence layer.
 */
#ifndef MAPPING_TRANSFER_H
#define MAPPING_TRANSFER_H

#include <stdbool.h>
#include <string.h>
#include "core/core.h"


/* One queued copy; its index in the batch is its place in add order. */
typedef struct batch_copy {
    mapping_buffer *buf;
    size_t          offset; /* in buf */
    size_t          bytes;
    union {                 /* one host pointer: a 40-byte record, not 48 */
        const void *src;    /* host source (to_gpu) */
        void       *dst;    /* host destination (!to_gpu) */
    };
    bool            to_gpu;
} batch_copy;

/* A maximal run of copies of one direction and buffer whose ranges overlap or
 * touch: moved as one range [lo, hi), staged or straight through. */
typedef struct batch_group {
    mapping_buffer *buf;
    size_t          lo, hi;
    size_t          staging_offset; /* staged groups: where its bytes lie in staging */
    size_t          first, count;   /* its members: plan.order[first, +count) */
    bool            to_gpu;
    bool            staged;
} batch_group;

/* What a flush does, built from the queued copies (moved into it). It stays
 * alive until the flush's work has completed: stream work reads it. Its
 * arrays are kept by the batch from one flush to the next, so that a batch
 * reused for flushes of similar size allocates (and faults in) nothing. */
typedef struct batch_plan {
    batch_copy  *copies;     /* the queued copies, in add order */
    size_t       count;
    size_t       copies_capacity; /* entries `copies` holds */
    size_t       capacity;   /* entries order, group_of, groups, done and keys hold */
    struct batch_sort_key *keys; /* scratch for sorting */
    size_t      *order;      /* copy indices sorted by direction, buffer, offset, index */
    size_t      *group_of;   /* copy index -> group index */
    batch_group *groups;     /* host-to-device groups first, each direction sorted by buffer */
    size_t       group_count;
    size_t       h2d_groups; /* groups[0, h2d_groups) are host-to-device */
    /* Staging layout: [h2d table | d2h table | h2d data | d2h data]. */
    size_t       h2d_table_offset, d2h_table_offset;
    size_t       h2d_staged, d2h_staged; /* staged groups per direction */
    size_t       h2d_straight, d2h_straight; /* groups per direction that go straight through */
    size_t       h2d_data_offset, d2h_data_offset, staging_bytes;
    char        *host_staging; /* set when the flush runs */
    bool        *done;         /* per copy: done (or queued to be done) */
    size_t       moved[2][2];  /* bytes moved: [host-to-device, device-to-host][staged, straight] */
    bool         d2h_read;     /* the gathered bytes' read is done or queued: unpack them once it is done */
    /* A direct flush (batch_direct.c) uses runs instead of groups, and
     * order[i] as copy i's place in staging. */
    struct batch_run *runs;
    size_t       run_count;
} batch_plan;

/* A direct flush's scatter or gather call: the merged ranges of one buffer,
 * entries[first_entry, +entries) of its direction's table, made of copies
 * [first_copy, +copies). */
typedef struct batch_run {
    mapping_buffer *buf;
    size_t          first_entry, entries;
    size_t          first_copy, copies;
} batch_run;

struct mapping_batch {
    mapping_device *dev;
    uint64_t        dev_serial; /* dev->serial when created */
    bool            busy;       /* a flush is running (re-entry from a callback is refused) */
    batch_copy     *copies;
    size_t          count, capacity;
    size_t          largest;      /* bytes of the largest queued copy */
    uint64_t        payload[2];   /* bytes queued, [0] to the host, [1] to the device (stats payload) */
    bool            unsorted;     /* the queue is not in plan order (kept by each add) */
    /* The add path's check, done in full once (see batch.c check_copy): the
     * handle removals when it last passed, and the buffer it passed for. */
    uint64_t              checked_removals;
    const mapping_buffer *checked_buf;

    batch_plan      plan;         /* of the last flush */
    mapping_event  *pending;      /* the last flush's end, when it was on a stream */
    /* The blocking stream whose wait failed in the last blocking flush (or
     * range move): its steps may still read the staging; waited for first. */
    mapping_stream *unwaited;
    void           *host_staging; /* page-locked (mapping_allocate_cpu), or dev_staging's own memory */
    mapping_buffer *dev_staging;
    bool            staging_shared; /* host_staging is dev_staging's memory (mapping__staging_shared) */
    size_t          staging_capacity;
    /* Staging outgrown by a flush, freed with the batch: a flush never frees
     * (a free may wait for every stream, and the caller's may wait for it). */
    struct batch_retired *retired;
};

/* A copy between host memory and staging or mapped device memory (never
 * overlapping). Scattered copies are mostly small: from 4 to 64 bytes they
 * are two overlapping moves of 4, 8, 16 or 32 bytes, inline, instead of a
 * call into memcpy each. */
static inline void mapping__copy_small(unsigned char *dst, const unsigned char *src, size_t n)
{
    if (n >= 16 && n <= 64) {
        if (n <= 32) {
            unsigned char a[16], b[16];
            memcpy(a, src, 16);
            memcpy(b, src + n - 16, 16);
            memcpy(dst, a, 16);
            memcpy(dst + n - 16, b, 16);
        } else {
            unsigned char a[32], b[32];
            memcpy(a, src, 32);
            memcpy(b, src + n - 32, 32);
            memcpy(dst, a, 32);
            memcpy(dst + n - 32, b, 32);
        }
        return;
    }
    if (n >= 4 && n < 16) { /* two overlapping 8- or 4-byte moves, not a libc call */
        if (n >= 8) {
            uint64_t a, b;
            memcpy(&a, src, 8);
            memcpy(&b, src + n - 8, 8);
            memcpy(dst, &a, 8);
            memcpy(dst + n - 8, &b, 8);
        } else {
            uint32_t a, b;
            memcpy(&a, src, 4);
            memcpy(&b, src + n - 4, 4);
            memcpy(dst, &a, 4);
            memcpy(dst + n - 4, &b, 4);
        }
        return;
    }
    memcpy(dst, src, n);
}

/* ---- internal twins of the public batch functions (validated arguments) ---- */
/* b is a live batch (public ones only: a mirror's batch is not registered)
 * of an open device, and not being flushed. */
mapping_status mapping__batch_check(const char *fn, const mapping_batch *b);
mapping_status mapping__batch_create(mapping_device *dev, mapping_batch **out);
void           mapping__batch_destroy(mapping_batch *b);
/* Frees the batch's own host memory only: for a batch whose device was
 * closed first (the device took its staging and event). */
void           mapping__batch_forget(mapping_batch *b);
mapping_status mapping__batch_flush(mapping_stream *stream, mapping_batch *b);
/* Empties the queue (as mapping_batch_clear). */
static inline void mapping__batch_clear(mapping_batch *b)
{
    b->count = 0;
    b->largest = 0;
    b->payload[0] = b->payload[1] = 0;
    b->unsorted = false;
}
/* Copies a and b (a added first) are in plan order: direction (host to
 * device first), buffer, offset. */
static inline bool mapping__batch_in_order(const batch_copy *a, const batch_copy *b)
{
    if (a->to_gpu != b->to_gpu)
        return a->to_gpu;
    if (a->buf != b->buf)
        return (uintptr_t)a->buf < (uintptr_t)b->buf;
    return a->offset <= b->offset;
}
/* Waits for the last flush's work (it may still read the plan and staging). */
mapping_status mapping__batch_wait_pending(mapping_batch *b);
/* Frees the page-locked and device staging buffers (batch_staging.c). */
void mapping__batch_free_staging(mapping_batch *b);

/* Groups at least this large go straight through (from the device's link);
 * never fewer than BATCH_LARGE_MIN bytes. */
enum { BATCH_LARGE_MIN = 64 << 10 };
size_t mapping__batch_large_bytes(mapping_device *dev);
/* Builds plan from b's queued copies, which move into the plan: on success b
 * is left empty (its queue array is the plan's spare one, at least as large);
 * on failure b is unchanged. `plan` is zeroed or a previous plan of b, whose
 * arrays are reused; no work may still be reading it. */
mapping_status mapping__batch_plan(mapping_batch *b, batch_plan *plan, size_t large_bytes);
/* The first step of mapping__batch_plan: the queued copies move into the
 * plan (arrays reserved, counts zeroed); the failure is recorded. */
mapping_status mapping__batch_plan_take(mapping_batch *b, batch_plan *plan);
/* How many of the first copies are in plan order (direction, buffer, offset). */
size_t         mapping__batch_sorted_prefix(const batch_copy *copies, size_t n);
/* A flush in one pass over the copies, without groups (batch_direct.c), for
 * a batch whose copies are all staged (below BATCH_LARGE_MIN), in plan order
 * (copies[0, sorted)), on a device with scatter and gather. queue: the
 * stream to queue on, NULL: each step blocking (the host steps run on this
 * thread either way; with a queue the caller waits for it, then calls
 * mapping__batch_direct_unpack). The plan is taken (mapping__batch_plan_take). */
bool           mapping__batch_direct_fits(const mapping_batch *b);
mapping_status mapping__batch_direct_run(mapping_stream *queue, mapping_batch *b, batch_plan *p);
void           mapping__batch_direct_unpack(batch_plan *p);
/* Blocking flushes through mapped device memory, where mapping__can_map
 * (batch_mapped.c); nothing queued, p->done says which copies were made.
 * _runs: the one-pass flush's copies (in plan order, all small): each run of
 * one direction and buffer through one mapping of its span, in one pass.
 * _any: copies in any order and of any size, touching at most 16 buffers
 * (mapping__batch_mapped_fits, asked before the plan is taken): each
 * buffer's span mapped once, the CPU copies in add order (host to device
 * first). */
mapping_status mapping__batch_mapped_runs(mapping_batch *b, batch_plan *p);
bool           mapping__batch_mapped_fits(const mapping_batch *b);
mapping_status mapping__batch_mapped_any(mapping_batch *b, batch_plan *p);
/* After a blocking flush's steps were queued on the device's blocking
 * stream (run: how queueing them went): waits for them, even after a failed
 * step, since they read the staging. A failed wait leaves b->unwaited (the
 * next use of the staging waits again) and, when the steps had all been
 * queued, records that which copies completed is unknown. Returns the
 * first failure (the step's message kept); *waited: the wait succeeded. */
mapping_status mapping__batch_wait_queued(mapping_batch *b, mapping_stream *queue, mapping_status run, bool *waited);
static inline size_t mapping__align_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}
/* The staging of a flush: at least `bytes` (batch_staging.c). */
mapping_status mapping__batch_ensure_staging(mapping_batch *b, size_t bytes);
/* Moves staging bytes to the device (host_staging + offset = src) or back
 * (dst = host_staging + offset); nothing to move when the staging is shared,
 * where packing was the transfer (counted as one). */
mapping_status mapping__batch_stage_out(mapping_stream *stream, mapping_batch *b, const void *src, size_t offset,
                                        size_t bytes);
mapping_status mapping__batch_stage_in(mapping_stream *stream, mapping_batch *b, size_t offset, void *dst, size_t bytes);
/* Frees the plan's arrays and zeroes it. */
void           mapping__batch_plan_free(batch_plan *plan);
/* Appends a copy; arguments validated by the caller. */
mapping_status mapping__batch_push(mapping_batch *b, const batch_copy *c);

/* ---- for the coherence layer: many ranges between one host array and one
 * buffer, through the batch machinery (coalesced, packed, scattered) ---- */

/* Copies host[lo, hi) to buf[base + lo, base + hi) for each range (to_gpu),
 * or back, as one flush. The ranges are the caller's list as it is (a
 * mirror passes its sorted stale ranges): no copy of them is made.
 * `reuse`: a batch of buf's device to run it through (its staging is kept
 * for the next call; it must be empty), or NULL for a temporary one (the
 * call then waits for the work before returning, even on a stream).
 * Ranges are checked against buf (not against the host array, whose size
 * the caller knows); hi < lo is refused, hi == lo skipped. Failure: as
 * mapping_batch_flush (copy indices count the non-empty ranges); with
 * `reuse`, the ranges not done stay queued in it. */
mapping_status mapping__transfer_ranges(mapping_stream *stream, mapping_batch *reuse, bool to_gpu, void *host,
                                        mapping_buffer *buf, size_t base, const mapping_range *ranges,
                                        size_t count);
/* mapping__transfer_ranges for a list the caller vouches for: its ranges
 * sorted by offset, disjoint, within buf from base, the longest `largest`
 * bytes (a mirror's stale ranges: checked when they were marked), and
 * handles its caller checked (a mirror sync validates once, at its public
 * call). Nothing is checked again: for a thousand ranges that pass cost
 * 0.8-1 us of a 7 us sync on the host back end. Builds with assertions (no
 * NDEBUG: the sanitizer builds) check the handles, the base and the ranges
 * and refuse a list that breaks the promise. */
mapping_status mapping__transfer_sorted_ranges(mapping_stream *stream, mapping_batch *reuse, bool to_gpu, void *host,
                                               mapping_buffer *buf, size_t base, const mapping_range *ranges,
                                               size_t count, size_t largest);
/* mapping__transfer_ranges' blocking path for ranges sorted by offset,
 * disjoint and each below BATCH_LARGE_MIN (mapping__transfer_ranges checks
 * that as it checks their bounds), on a back end that scatters and gathers,
 * through an empty `b`, without queueing them: a table entry per non-empty
 * range, packed and scattered (or gathered and unpacked) at once; queue as
 * for mapping__batch_direct_run. On failure no range is known to be done,
 * and nothing stays queued. */
mapping_status mapping__batch_direct_ranges(mapping_stream *queue, mapping_batch *b, bool to_gpu, void *host,
                                            mapping_buffer *buf, size_t base, const mapping_range *r, size_t n);
/* The same through mapped device memory, where mapping__can_map
 * (batch_mapped.c): one mapping of the span the ranges cover, the CPU
 * copies, counted as one transfer (b: for the counters and the trace). On
 * failure no range is known to be done. */
mapping_status mapping__batch_mapped_ranges(mapping_batch *b, bool to_gpu, void *host, mapping_buffer *buf,
                                            size_t base, const mapping_range *r, size_t n);

#endif
