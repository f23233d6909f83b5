/*
 * The transfer layer's internals: batches (batch.c: queueing; batch_plan.c:
 * sorting and coalescing; batch_flush.c: running a plan; pipeline.c) and the
 * entry point the coherence layer uses to move many ranges of one mirror.
 * The transfer layer sits on core (core/core.h, core/ops.h) and is used by
 * the coherence layer.
 */
#ifndef MAPPING_TRANSFER_H
#define MAPPING_TRANSFER_H

#include <stdbool.h>
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
} batch_plan;

struct mapping_batch {
    mapping_device *dev;
    uint64_t        dev_serial; /* dev->serial when created */
    bool            busy;       /* a flush is running (re-entry from a callback is refused) */
    batch_copy     *copies;
    size_t          count, capacity;
    size_t          largest;      /* bytes of the largest queued copy */

    batch_plan      plan;         /* of the last flush */
    mapping_event  *pending;      /* the last flush's end, when it was on a stream */
    void           *host_staging; /* page-locked (mapping_allocate_cpu) */
    mapping_buffer *dev_staging;
    size_t          staging_capacity;
    /* Staging outgrown by a flush, freed with the batch: a flush never frees
     * (a free may wait for every stream, and the caller's may wait for it). */
    struct batch_retired *retired;
};

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
}
/* Waits for the last flush's work (it may still read the plan and staging). */
mapping_status mapping__batch_wait_pending(mapping_batch *b);
/* Frees the page-locked and device staging buffers (batch_flush.c). */
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
/* Frees the plan's arrays and zeroes it. */
void           mapping__batch_plan_free(batch_plan *plan);
/* Appends a copy; arguments validated by the caller. */
mapping_status mapping__batch_push(mapping_batch *b, const batch_copy *c);

/* ---- for the coherence layer: many ranges between one host array and one
 * buffer, through the batch machinery (coalesced, packed, scattered) ---- */
typedef struct mapping_transfer_range {
    size_t host_offset;   /* in `host` */
    size_t buffer_offset; /* in `buf` */
    size_t bytes;
} mapping_transfer_range;

/* Copies each range host -> buf (to_gpu) or buf -> host, as one flush.
 * `reuse`: a batch of buf's device to run it through (its staging is kept
 * for the next call; it must be empty), or NULL for a temporary one (the
 * call then waits for the work before returning, even on a stream).
 * Ranges are checked against buf (not against the host array, whose size
 * the caller knows). Zero-byte ranges are skipped. Failure: as
 * mapping_batch_flush (copy indices count the non-empty ranges); with `reuse`, the
 * ranges not done stay queued in it. */
mapping_status mapping__transfer_ranges(mapping_stream *stream, mapping_batch *reuse, bool to_gpu, void *host,
                                        mapping_buffer *buf, const mapping_transfer_range *ranges, size_t count);

#endif
