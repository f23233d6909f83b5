/*
 * Residency (a feature, mirror_features.h): a family whose device side may
 * be evicted under the device's memory budget (core/budget.c) and made
 * again when a call needs it. It is begun for every family made on a device
 * with a budget (not unified, not adopted: those are never evicted), and by
 * mapping_mirror_evict or _set_residency on any other.
 *
 * - The family's lock: every public call holds it (call_begin, call_end),
 *   so an eviction started by another thread (an allocation on the same
 *   device) either takes the lock when no call is running, or skips the
 *   family. An error-checking mutex: a call on the family from inside its
 *   own eviction (a log callback) gets MAPPING_ERR_BUSY, not a deadlock.
 * - Eviction (evict_locked): the features' collect (tracked writes become
 *   marks), a blocking sync of the whole family to the CPU (exactly its
 *   stale bytes, through the stages: the diff refines it), the state's
 *   transition (mirror_state.c: mapping__mirror_state_evicted), then the
 *   memory goes back to the budget.
 * - Materialization (materialize): the next sync to the GPU or acquire_gpu
 *   allocates the whole family's buffer again (views keep their offsets);
 *   the sync then uploads what the call covers, as for any stale bytes.
 * - Never evicted by the budget: a family acquired for the GPU and not
 *   released, one with queued work, one in a call (locked), one hinted
 *   MAPPING_RESIDENCY_KEEP (core skips it).
 * - Re-uploads: the bytes valid on the device when it was evicted
 *   (`dropped`) that a later sync to the GPU uploads again, unless a mark
 *   changed them since (they would have moved anyway).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include "coherence/mirror_api.h"
#include "coherence/mirror_features.h"
#include "coherence/mirror_mark_log.h"
#include "coherence/mirror_observe.h"

struct mirror_resident {
    mapping_reclaimable node; /* first: the hook finds the family from it */
    mirror_state       *st;
    pthread_mutex_t     lock;     /* held by every call on the family, and by an eviction */
    _Atomic(const void *) caller; /* the thread in a call on the family (core.h's token), or NULL */
    _Atomic bool        resident; /* st->gpu is allocated */
    bool                registered; /* on the device's list (core) */
    mapping_range_set   dropped;  /* valid on the device at the last eviction, not uploaded or marked since */
};

static mapping_status lock_failed(const char *fn, const mirror_state *st, int rc)
{
    if (rc == EDEADLK)
        return mapping__fail(MAPPING_ERR_BUSY, "%s: the mirror family %p is being evicted (called from a callback of "
                                               "that eviction)", fn, (const void *)st);
    return mapping__fail(MAPPING_ERR_INTERNAL, "%s: the mirror family's lock: error %d", fn, rc);
}

static mapping_status resident_call_begin(const char *fn, mirror_state *st)
{
    int rc = pthread_mutex_lock(&st->resident->lock);
    if (rc)
        return lock_failed(fn, st, rc);
    atomic_store_explicit(&st->resident->caller, mapping__reclaim_thread_token(), memory_order_relaxed);
    mapping__reclaimable_touch(st->dev, &st->resident->node);
    return MAPPING_OK;
}

static void resident_call_end(mirror_state *st)
{
    atomic_store_explicit(&st->resident->caller, NULL, memory_order_relaxed);
    pthread_mutex_unlock(&st->resident->lock);
}

/* ---- materialization ---- */

static mapping_status materialize(const char *fn, mirror_state *st)
{
    struct mirror_resident *r = st->resident;
    if (atomic_load_explicit(&r->resident, memory_order_relaxed))
        return MAPPING_OK;
    mapping_buffer *buf = NULL;
    mapping_status status = mapping__allocate_gpu_counted(fn, st->dev, st->size, &buf);
    if (status != MAPPING_OK)
        return status; /* nothing changed: the family is valid on the CPU */
    buf->owner = "mirror";
    st->gpu = buf;
    atomic_store(&r->resident, true);
    atomic_store(&r->node.bytes, st->size);
    return MAPPING_OK;
}

static mapping_status resident_before_sync(const char *fn, mapping_stream *stream, mirror_state *st, int t, size_t lo,
                                           size_t hi)
{
    (void)stream, (void)lo, (void)hi;
    return t == MIRROR_GPU ? materialize(fn, st) : MAPPING_OK;
}

static mapping_status resident_device_use(const char *fn, mirror_state *st, int use)
{
    if (use == MIRROR_USE_ACQUIRE)
        return materialize(fn, st);
    if (atomic_load_explicit(&st->resident->resident, memory_order_relaxed)) /* MIRROR_USE_MARK */
        return MAPPING_OK;
    return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: the mirror's device side is not resident (evicted under the device's memory "
                         "budget, or by mapping_mirror_evict): there are no device bytes to mark; acquire it "
                         "(mapping_mirror_acquire_gpu) before device work",
                         fn);
}

/* ---- what was dropped comes back: the re-upload count ---- */

static void resident_marked(mirror_state *st, int x, size_t lo, size_t hi, bool discard)
{
    (void)x, (void)discard;
    mapping_range_set *d = &st->resident->dropped;
    if (d->count && mapping__rs_intersects(d, lo, hi) && mapping__rs_remove(d, lo, hi) != MAPPING_OK)
        mapping__rs_free(d); /* out of memory: count no more re-uploads there */
}

static mapping_status resident_copied(mapping_stream *stream, mirror_state *st, const sync_plan *p,
                                      mapping_status status)
{
    (void)stream;
    mapping_range_set *d = &st->resident->dropped;
    if (p->target != MIRROR_GPU || status != MAPPING_OK || !d->count)
        return MAPPING_OK;
    uint64_t again = 0;
    for (size_t i = 0; i < p->n_exact; i++)
        again += mapping__rs_bytes_in(d, p->exact[i].lo, p->exact[i].hi);
    mapping__count(&st->dev->counters.evict_reupload_bytes, again);
    if (again && mapping__rs_remove_sorted(d, p->exact, p->n_exact) != MAPPING_OK)
        mapping__rs_free(d);
    return MAPPING_OK;
}

/* dropped := the bytes valid on the device now (not stale there). */
static void note_dropped(mirror_state *st)
{
    mapping_range_set *d = &st->resident->dropped;
    mapping__rs_free(d);
    size_t at = 0;
    mapping_rs_cursor c;
    mapping_range r;
    bool ok = mapping__rs_seek(&st->stale[MIRROR_GPU], 0, &c, &r);
    for (; at < st->size; ok = mapping__rs_next(&c, &r)) {
        size_t end = ok ? r.lo : st->size;
        if (end > at && mapping__rs_add(d, at, end) != MAPPING_OK) {
            mapping__rs_free(d);
            return;
        }
        if (!ok)
            break;
        at = r.hi;
    }
}

/* ---- eviction ---- */

/* Whether the family may go now (automatic eviction): resident, not
 * acquired, no CUDA graph syncing it (its nodes address the device side),
 * nothing queued (completed work folded first). */
static bool evictable(mirror_state *st)
{
    struct mirror_resident *r = st->resident;
    if (!atomic_load_explicit(&r->resident, memory_order_relaxed) || st->acquired || atomic_load(&st->graphs))
        return false;
    if (st->queue.n)
        mapping__mirror_fold_completed(st);
    return st->queue.n == 0;
}

static void report(const mapping_trace_span *span, mirror_state *st, size_t written_back, bool explicit_,
                   mapping_status status)
{
    MAPPING_TRACE_END(*span, .name = "mirror eviction", .cat = "mirror", .device = st->dev,
                      .device_name = st->dev->info.name, .buffer = st->gpu, .direction = "d2h", .status = status,
                      .args = {{"bytes", st->size}, {"bytes_written_back", written_back}, {"explicit", explicit_}});
    if (status == MAPPING_OK)
        mapping__log(2, "mirror eviction of %zu bytes%s: %zu bytes written back to the CPU", st->size,
                     explicit_ ? " (mapping_mirror_evict)" : " (memory budget)", written_back);
}

/* The family's lock is held and it is resident with nothing queued. */
static mapping_status evict_locked(const char *fn, mirror_state *st, bool explicit_)
{
    mapping_trace_span span = mapping__trace_begin();
    mapping_status status;
    size_t back = 0;
    if ((status = mapping__mirror_collect(fn, st, false)) == MAPPING_OK &&
        (status = mapping__mirror_log_flush(st)) == MAPPING_OK) {
        back = mapping__rs_bytes_in(&st->stale[MIRROR_CPU], 0, st->size);
        if (back)
            status = mapping__mirror_sync_family(fn, st, MIRROR_CPU);
    }
    if (status == MAPPING_OK) {
        note_dropped(st);
        status = mapping__mirror_state_evicted(fn, st);
    }
    report(&span, st, back, explicit_, status);
    if (status != MAPPING_OK)
        return status; /* still resident, nothing lost: the CPU holds what it held */
    struct mirror_resident *r = st->resident;
    atomic_store(&r->node.bytes, 0);
    atomic_store(&r->resident, false);
    mapping__free_gpu(st->gpu);
    st->gpu = NULL;
    mapping__count(&st->dev->counters.evictions, 1);
    mapping__count(&st->dev->counters.evict_writeback_bytes, back);
    return MAPPING_OK;
}

/* The budget's hook (core/budget.c), on the thread that needs memory. */
static mapping_evict_result evict_hook(mapping_reclaimable *node)
{
    struct mirror_resident *r = (struct mirror_resident *)node;
    if (pthread_mutex_trylock(&r->lock) != 0) /* in a call: on another thread, or the allocation's own */
        return atomic_load_explicit(&r->caller, memory_order_relaxed) == mapping__reclaim_thread_token()
                   ? MAPPING_EVICT_REFUSED
                   : MAPPING_EVICT_IN_USE;
    mapping_error_mark before;
    mapping__error_mark(&before);
    bool done = evictable(r->st) && evict_locked("mirror eviction (memory budget)", r->st, false) == MAPPING_OK;
    mapping__error_forget(&before); /* a failed eviction is not the caller's error: it tries another */
    pthread_mutex_unlock(&r->lock);
    return done ? MAPPING_EVICT_DONE : MAPPING_EVICT_REFUSED;
}

mapping_status mapping__mirror_resident_evict(const char *fn, mirror_state *st)
{
    struct mirror_resident *r = st->resident;
    if (!atomic_load_explicit(&r->resident, memory_order_relaxed))
        return MAPPING_OK;
    if (st->acquired)
        return mapping__fail(MAPPING_ERR_BUSY, "%s: the mirror is acquired for the GPU (mapping_mirror_acquire_gpu) "
                                               "and not released: release it first", fn);
    if (atomic_load(&st->graphs))
        return mapping__fail(MAPPING_ERR_BUSY, "%s: a CUDA graph syncs the mirror (mapping_mirror_sync_in_graph): its "
                                               "nodes address the device side; destroy the graph first", fn);
    mapping_status status = st->queue.n ? mapping__mirror_order(st, NULL, 0, st->size, MIRROR_ACCESS) : MAPPING_OK;
    if (status == MAPPING_OK && st->queue.n)
        status = mapping__mirror_drain(st);
    return status ? status : evict_locked(fn, st, true);
}

/* ---- lifetime ---- */

/* Leaves the device's list; with its lock taken, so that an eviction on
 * another thread is over first. Not when the device was closed first (its
 * list went with it). */
void mapping__mirror_resident_retire(mirror_state *st, bool device_closed)
{
    struct mirror_resident *r = st->resident;
    if (!r || !r->registered || device_closed)
        return;
    pthread_mutex_lock(&r->lock);
    mapping__reclaimable_remove(st->dev, &r->node);
    r->registered = false;
    pthread_mutex_unlock(&r->lock);
}

static void resident_end(mirror_state *st, bool device_closed)
{
    struct mirror_resident *r = st->resident;
    mapping__mirror_resident_retire(st, device_closed);
    mapping__rs_free(&r->dropped);
    pthread_mutex_destroy(&r->lock);
    free(r);
    st->resident = NULL;
}

static const mirror_feature resident_feature = {
    .name = "residency",
    .stages = MIRROR_STAGES_TO_GPU,
    .call_begin = resident_call_begin,
    .call_end = resident_call_end,
    .device_use = resident_device_use,
    .before_sync = resident_before_sync,
    .marked = resident_marked,
    .copied = resident_copied,
    .end = resident_end,
};

mapping_status mapping__mirror_resident_begin(const char *fn, mirror_state *st, bool locked)
{
    struct mirror_resident *r = mapping_os_calloc(1, sizeof *r);
    if (!r)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&r->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    if (locked) {
        pthread_mutex_lock(&r->lock); /* the call that begins it ends with its call_end */
        atomic_init(&r->caller, mapping__reclaim_thread_token());
    }
    r->st = st;
    r->node.evict = evict_hook;
    mapping__rs_init(&r->dropped);
    atomic_init(&r->resident, st->gpu != NULL);
    atomic_init(&r->node.bytes, st->gpu ? st->size : 0);
    st->resident = r;
    mapping__mirror_add_feature(st, &resident_feature);
    mapping__reclaimable_touch(st->dev, &r->node);
    mapping__reclaimable_add(st->dev, &r->node);
    r->registered = true;
    return MAPPING_OK;
}

void mapping__mirror_resident_unlock(mirror_state *st)
{
    resident_call_end(st);
}

void mapping__mirror_resident_hint(mirror_state *st, int hint)
{
    atomic_store(&st->resident->node.hint, hint);
}

bool mapping__mirror_resident_is(const mirror_state *st)
{
    return !st->resident || atomic_load(&st->resident->resident);
}

mapping_buffer *mapping__mirror_resident_gpu(mirror_state *st)
{
    struct mirror_resident *r = st->resident;
    if (pthread_mutex_lock(&r->lock) != 0) /* inside its own eviction (a callback): being freed */
        return NULL;
    mapping_buffer *gpu = st->gpu;
    pthread_mutex_unlock(&r->lock);
    return gpu;
}
