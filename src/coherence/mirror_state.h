/*
 * A mirror's state, and the one place that changes it (mirror_state.c).
 *
 * A family (a mirror, its views, views of views) shares one mirror_state.
 * Side indices: 0 = CPU, 1 = GPU (mapping_side - 1). Offsets are absolute
 * within the family.
 *
 * The state has six parts, each with one owner:
 *   identity and lifetime  the device, the handles' count        mirror.c
 *   memory                 the two sides and how they were made  mirror.c
 *   validity               stale / modified / pending per side   mirror_state.c (+ its mark log)
 *   queued work            copies and device work on streams     mirror_queue.c (events),
 *                                                                 mirror_state.c (folding)
 *   features               optional hooks and their private data mirror_track.c, mirror_diff.c,
 *                                                                 mirror_check.c, mirror_unified.c
 *   the batch              many-range syncs (transfer layer)     mirror_copy.c
 *
 * Validity invariants (tested by tests/conformance/mirror_matrix_model.c):
 * - stale[0] and stale[1] are disjoint: no byte is stale on both sides; a
 *   byte valid on both sides has the same content on both.
 * - modified[x] ⊆ stale[1 - x] once every queued copy has been folded:
 *   modified bytes of x are the stale bytes of the other side that a mark
 *   made stale (not the GPU side's initial staleness).
 * - pending[t] ⊆ stale[t]: ranges whose copy to t is queued; they stay
 *   stale until the copy's event completes and the entry is folded.
 *
 * Every public call runs in this order (docs/mirrors.md, "The state
 * table"): check the handle (once), enter (the features' collect: a
 * tracked CPU write becomes a CPU mark of the bytes it changed), then the
 * operation. A sync's stages are collect, plan, copy and commit
 * (mirror_sync.c).
 */
#ifndef MAPPING_MIRROR_STATE_H
#define MAPPING_MIRROR_STATE_H

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

typedef struct mirror_queue {
    mirror_inflight *v;
    size_t           n, cap;
} mirror_queue;

/* Marks not yet applied to the range sets (mirror_mark_log.c): all of side
 * `side`, appended in a few ns; the sets see them at the next flush, which
 * every reader and writer of the sets calls first. */
typedef struct mirror_log {
    mapping_range *v;
    size_t         n, cap;
    mapping_range *scratch; /* the sort's second array, cap entries when set (kept: no fresh pages per sort) */
    size_t         sorted;  /* v[0, sorted) is sorted, disjoint and not touching (the last compaction's) */
    bool           unsorted; /* false: all of the log is (appends in order) */
    int            side;
} mirror_log;

/* What a sync of [lo, hi) to side t copies: the exact stale ranges (which
 * become valid) and the ranges copied (merged neighbours, or a feature's
 * refinement such as the device diff's changed blocks; `moved` bytes). */
typedef struct sync_plan {
    int            target;
    mapping_range *exact, *merged;
    size_t         n_exact, n_merged, moved;
    bool           refined; /* merged is a subset of exact (the diff), not exact plus gaps */
} sync_plan;

typedef struct mirror_state mirror_state;

/* An optional feature of a family: a table of hooks, each NULL when the
 * feature has nothing to do at that point (in the spirit of the back-end
 * table). A family without features (n_features == 0) runs none of this:
 * its fast paths test that one word. */
/* What a call needs of the device side (the device_use hook). */
enum {
    MIRROR_USE_ACQUIRE, /* acquire_gpu: the device side must exist (made again after an eviction) */
    MIRROR_USE_MARK     /* mark_gpu_modified: device bytes must exist (refused, not made) */
};

typedef struct mirror_feature {
    const char *name;
    /* The sync directions whose stages it takes part in (MIRROR_STAGES_TO_*):
     * a sync in another direction may take the fast path. */
    unsigned stages;
    /* A public call on the family begins (before the collect) and ends:
     * every begin that succeeded has its end. The residency feature holds
     * the family's lock between them (an eviction from another thread
     * waits, or skips the family). */
    mapping_status (*call_begin)(const char *fn, mirror_state *st);
    void (*call_end)(mirror_state *st);
    /* The call needs the device side (MIRROR_USE_*): may make it, or refuse. */
    mapping_status (*device_use)(const char *fn, mirror_state *st, int use);
    /* The family's device side is being evicted (its GPU side becomes stale
     * everywhere and its memory goes): drop what lives there. */
    void (*evicted)(mirror_state *st);
    /* Every call, before the state is read: the CPU side's bytes the
     * program changed since the last call, sorted and disjoint, malloc'd
     * into *out (NULL, 0: none). upload: the call syncs to the GPU. */
    mapping_status (*collect)(const char *fn, mirror_state *st, bool upload, mapping_range **out, size_t *n);
    /* A mark of side x over [lo, hi) is being made (discard: the other
     * side's unsynced modifications there are dropped). */
    void (*marked)(mirror_state *st, int x, size_t lo, size_t hi, bool discard);
    /* The CPU side's content over [lo, hi) no longer is what both sides
     * last agreed on, without a CPU mark (a discard on the GPU side, a
     * tracked write to bytes stale on the CPU). */
    void (*cpu_diverged)(mirror_state *st, size_t lo, size_t hi);
    /* A sync of [lo, hi) to t is about to look at the state: may refuse. */
    mapping_status (*before_sync)(const char *fn, mapping_stream *stream, mirror_state *st, int t, size_t lo,
                                  size_t hi);
    /* The plan of a sync: may replace what is copied (p->merged). */
    mapping_status (*refine)(mapping_stream *stream, mirror_state *st, sync_plan *p);
    /* The copy step itself, instead of copying (unified memory: a prefetch). */
    mapping_status (*copy)(mapping_stream *stream, mirror_state *st, int t, const mapping_range *v, size_t n,
                           size_t *done);
    /* The copy step is about to write these ranges of side t. */
    void (*before_copy)(mapping_stream *stream, mirror_state *st, int t, const mapping_range *v, size_t n);
    /* The plan's copies were done (no stream) or queued on stream, with
     * this status. Not OK: the state cannot follow (the sync then fails). */
    mapping_status (*copied)(mapping_stream *stream, mirror_state *st, const sync_plan *p, mapping_status status);
    /* A sync of [lo, hi) to t on stream succeeded (its report is out),
     * moving `moved` bytes (0: it found nothing stale). */
    void (*synced)(mapping_stream *stream, mirror_state *st, int t, size_t lo, size_t hi, size_t moved);
    /* The family ends; device_closed: its device took the buffers. */
    void (*end)(mirror_state *st, bool device_closed);
} mirror_feature;

enum { MIRROR_FEATURES_MAX = 5 };
enum { MIRROR_STAGES_TO_CPU = 1u << MIRROR_CPU, MIRROR_STAGES_TO_GPU = 1u << MIRROR_GPU };

struct mirror_state {
    /* identity and lifetime */
    mapping_device *dev;
    uint64_t        dev_serial; /* dev->serial when created */
    /* mapping__handle_removals_any() when the device was last found open:
     * while it stands, the device still is (no lookup per call). */
    uint64_t        dev_checked_removals;
    _Atomic int     refs;   /* handles of the family, and graphs holding it (mirror_graph.c) */
    _Atomic int     graphs; /* of those, CUDA graphs that sync it: its device side may not be evicted */
    /* A sync is running: re-entry (from the log callback) is refused. Only
     * the family's own calls set it (an eviction on another thread does
     * not: mapping__mirror_sync_family), so a handle check reads it plainly. */
    bool            busy;

    /* memory */
    size_t          size;
    unsigned char  *cpu;
    mapping_buffer *gpu;
    size_t          gpu_base;     /* byte 0 of the family lies at gpu[gpu_base] (adopt) */
    void           *cpu_alloc;    /* owns_cpu: the block allocated (cpu lies inside it, page-aligned when tracked) */
    size_t          cpu_bytes;    /* owns_cpu: the bytes of cpu the mirror owns (whole pages when tracked) */
    bool            owns_cpu;     /* from mapping_allocate_cpu (create), not wrapped */
    bool            unified;      /* cpu is the host address of gpu's unified memory */
    bool            pinned;       /* wrapped memory registered with mapping__host_register */
    bool            borrowed_gpu; /* mapping_mirror_adopt: gpu is the caller's, never freed here */
    bool            cpu_writable; /* wrapped memory found writable (the first copy into it asks, mirror_copy.c) */

    /* validity */
    mapping_range_set stale[2], modified[2], pending[2];
    mirror_log        log;

    /* queued work */
    mirror_queue   queue;
    int            acquired; /* acquire_gpu calls not released yet (the device side is held) */
    mapping_batch *batch; /* many-range syncs go through it; made on first need */

    /* features, and their private state (NULL when off) */
    const mirror_feature *features[MIRROR_FEATURES_MAX];
    int                   n_features;
    unsigned              stages; /* the features' MIRROR_STAGES_TO_*, or-ed: one word for the fast path */
    struct mirror_track  *track; /* MAPPING_MIRROR_TRACK_WRITES (mirror_track.c) */
    struct mirror_diff   *diff;  /* MAPPING_MIRROR_DEVICE_DIFF (mirror_diff.c) */
    struct mirror_resident *resident; /* memory budget, eviction (mirror_resident.c) */
};

struct mapping_mirror {
    mirror_state *st;
    size_t        offset, size; /* absolute position of this handle in the family */
};

/* ---- mirror_state.c: the transitions ---- */

/* A new state: CPU valid everywhere, GPU stale everywhere. */
mapping_status mapping__mirror_state_new(const char *fn, mapping_device *dev, size_t bytes, mirror_state **out);
/* Frees the state's own host memory (sets, log, queue entries): the
 * caller ended the features and freed the sides first. */
void           mapping__mirror_state_free(mirror_state *st);
/* The adopted device side holds the data: the CPU side is stale. */
mapping_status mapping__mirror_state_gpu_valid(mirror_state *st);
/* Frees what CUDA graphs gave up since (mirror_graph.c sets it when a graph
 * first holds a family; mirror.c calls it at create and destroy): a pointer,
 * so that mirror.c and mirror_graph.c do not call each other. */
extern void (*_Atomic mapping__mirror_reaper)(void);
static inline void mapping__mirror_reap(void)
{
    void (*reap)(void) = atomic_load_explicit(&mapping__mirror_reaper, memory_order_acquire);
    if (reap)
        reap();
}
/* Adds a feature to the family (at creation). */
void           mapping__mirror_add_feature(mirror_state *st, const mirror_feature *f);
/* Ends every feature (last first). */
void           mapping__mirror_end_features(mirror_state *st, bool device_closed);

/* The start of every public call, after the handle was checked: the
 * features' call_begin, then their collect (mapping__mirror_collect). On
 * failure nothing is held; on success mapping__mirror_leave ends the call.
 * upload: the call syncs to the GPU. */
mapping_status mapping__mirror_enter(const char *fn, mirror_state *st, bool upload);
static inline mapping_status mapping__mirror_enter_fast(const char *fn, mirror_state *st, bool upload)
{
    return __builtin_expect(st->n_features == 0, 1) ? MAPPING_OK : mapping__mirror_enter(fn, st, upload);
}
/* The end of a call that entered: the features' call_end. */
void mapping__mirror_leave(mirror_state *st);
static inline void mapping__mirror_leave_fast(mirror_state *st)
{
    if (__builtin_expect(st->n_features != 0, 0))
        mapping__mirror_leave(st);
}
/* The features' collect: CPU writes become CPU marks of the bytes they
 * changed (a write to bytes stale on the CPU is a conflict, counted; the
 * device's content wins). Completed copies are folded first. */
mapping_status mapping__mirror_collect(const char *fn, mirror_state *st, bool upload);

/* Marks side x modified over [lo, hi): x valid, the other side stale.
 * MAPPING_ERR_CONFLICT (counted, nothing changes) when the other side holds
 * modifications there not yet synced, unless discard (they are dropped).
 * The caller ordered queued work first. All or nothing. */
mapping_status mapping__mirror_mark(const char *fn, mirror_state *st, int x, size_t lo, size_t hi, bool discard);
/* The public marks: orders after queued work, then logs or marks. */
mapping_status mapping__mirror_mark_ordered(const char *fn, mirror_state *st, int x, size_t lo, size_t hi);

/* Makes the sorted ranges v[0..n) valid on side t (the other side's
 * modifications there synced, no longer stale nor queued); idempotent,
 * redone later when it fails part-way (out of memory). */
mapping_status mapping__mirror_apply_valid(mirror_state *st, int t, const mapping_range *v, size_t n);
/* The copies to t of a blocking sync of the whole family, whose stale
 * ranges were the log's and stale[t]'s: stale[t] and modified[1 - t]
 * become empty, the log too (mirror_sync.c's fast path). */
static inline void mapping__mirror_whole_synced(mirror_state *st, int t)
{
    mapping__rs_free(&st->stale[t]);
    mapping__rs_free(&st->modified[1 - t]);
    st->log.n = 0;
}

/* The device side goes (an eviction): stale on the GPU everywhere, as at
 * create, with nothing queued; the features' evicted hooks drop what lives
 * there. The caller wrote back every byte stale on the CPU first and frees
 * the memory after: MAPPING_ERR_INTERNAL (nothing changes) when bytes are
 * still stale on the CPU or work is queued. Modifications of the CPU side
 * not yet synced stay modifications (conflicts are as before). */
mapping_status mapping__mirror_state_evicted(const char *fn, mirror_state *st);

/* Folds every queued entry whose event has completed. */
void           mapping__mirror_fold_completed(mirror_state *st);
/* Orders the caller after queued work touching [lo, hi): with stream NULL
 * it waits (and folds); otherwise it chains `stream` on work of other
 * streams, except entries whose target is wait_target, which it waits for. */
mapping_status mapping__mirror_order(mirror_state *st, mapping_stream *stream, size_t lo, size_t hi, int wait_target);
/* Waits for everything (a failed wait is tried twice); folds nothing. Not
 * OK when some queued copy could not be waited for: it may still use the
 * memory. */
mapping_status mapping__mirror_drain(mirror_state *st);

/* ---- the features' hooks, run by the stages (mirror_state.c) ---- */
void           mapping__mirror_hook_marked(mirror_state *st, int x, size_t lo, size_t hi, bool discard);
void           mapping__mirror_hook_cpu_diverged(mirror_state *st, size_t lo, size_t hi);
mapping_status mapping__mirror_hook_before_sync(const char *fn, mapping_stream *stream, mirror_state *st, int t,
                                                size_t lo, size_t hi);
mapping_status mapping__mirror_hook_refine(mapping_stream *stream, mirror_state *st, sync_plan *p);
/* The feature's copy step, or NULL when the default one copies. */
const mirror_feature *mapping__mirror_hook_copier(const mirror_state *st);
void           mapping__mirror_hook_before_copy(mapping_stream *stream, mirror_state *st, int t, const mapping_range *v,
                                                size_t n);
mapping_status mapping__mirror_hook_copied(mapping_stream *stream, mirror_state *st, const sync_plan *p,
                                           mapping_status status);
void           mapping__mirror_hook_synced(mapping_stream *stream, mirror_state *st, int t, size_t lo, size_t hi,
                                           size_t moved);
mapping_status mapping__mirror_hook_device_use(const char *fn, mirror_state *st, int use);

#endif
