/*
 * The one owner of a mirror's validity: every change to the stale,
 * modified and pending sets goes through a function of this file (or of
 * its mark log, mirror_mark_log.c, which applies marks lazily). The other
 * mirror files decide what to do; this one does it, and runs the features'
 * hooks where the state changes (mirror_state.h).
 */
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_mark_log.h"
#include "coherence/mirror_queue.h"
#include "coherence/mirror_state.h"

/* ---- lifetime ---- */

void (*_Atomic mapping__mirror_reaper)(void);

mapping_status mapping__mirror_state_new(const char *fn, mapping_device *dev, size_t bytes, mirror_state **out)
{
    mirror_state *st = mapping_os_calloc(1, sizeof *st);
    if (!st)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    st->dev = dev;
    st->dev_serial = dev->serial;
    st->size = bytes;
    for (int s = 0; s < 2; s++) {
        mapping__rs_init(&st->stale[s]);
        mapping__rs_init(&st->modified[s]);
        mapping__rs_init(&st->pending[s]);
    }
    mapping_status status = mapping__rs_add(&st->stale[MIRROR_GPU], 0, bytes);
    if (status != MAPPING_OK) {
        free(st);
        return status;
    }
    *out = st;
    return MAPPING_OK;
}

void mapping__mirror_state_free(mirror_state *st)
{
    mapping__mirror_log_free(st);
    mapping__mirror_queue_free(&st->queue);
    for (int s = 0; s < 2; s++) {
        mapping__rs_free(&st->stale[s]);
        mapping__rs_free(&st->modified[s]);
        mapping__rs_free(&st->pending[s]);
    }
    free(st);
}

mapping_status mapping__mirror_state_gpu_valid(mirror_state *st)
{
    mapping_status status;
    if ((status = mapping__rs_remove(&st->stale[MIRROR_GPU], 0, st->size)))
        return status;
    return mapping__rs_add(&st->stale[MIRROR_CPU], 0, st->size);
}

void mapping__mirror_add_feature(mirror_state *st, const mirror_feature *f)
{
    if (st->n_features < MIRROR_FEATURES_MAX) {
        st->features[st->n_features++] = f;
        st->stages |= f->stages;
    }
}

void mapping__mirror_end_features(mirror_state *st, bool device_closed)
{
    while (st->n_features > 0) {
        const mirror_feature *f = st->features[--st->n_features];
        if (f->end)
            f->end(st, device_closed);
    }
}

/* ---- marks ---- */

/* Does [lo, hi) hold modifications of side y that are not already queued to
 * be copied to the other side? (Queued ones are synced: no conflict.) */
static bool has_unsynced_modification(const mirror_state *st, int y, size_t lo, size_t hi)
{
    const mapping_range_set *mod = &st->modified[y], *queued = &st->pending[1 - y];
    mapping_rs_cursor c;
    mapping_range r;
    for (bool ok = mapping__rs_seek(mod, lo, &c, &r); ok && r.lo < hi; ok = mapping__rs_next(&c, &r)) {
        size_t a = r.lo > lo ? r.lo : lo;
        size_t b = r.hi < hi ? r.hi : hi;
        if (mapping__rs_bytes_in(queued, a, b) != b - a)
            return true;
    }
    return false;
}

/* The transition of a mark, without the marked hooks. */
static mapping_status mark_sets(const char *fn, mirror_state *st, int x, size_t lo, size_t hi, bool discard)
{
    int y = 1 - x;
    mapping_status status;
    if ((status = mapping__mirror_log_flush(st)))
        return status;
    if (!discard && has_unsynced_modification(st, y, lo, hi)) {
        mapping__count(&st->dev->counters.conflicts, 1);
        return mapping__fail(MAPPING_ERR_CONFLICT,
                             "%s: [%zu, %zu) is also modified on the %s side and not synced; sync it first", fn, lo,
                             hi, y == MIRROR_CPU ? "CPU" : "GPU");
    }
    /* Reserve first: every change below then succeeds, so the mark is all or nothing. */
    if ((status = mapping__rs_reserve(&st->stale[y], 1)) || (status = mapping__rs_reserve(&st->modified[x], 1)) ||
        (status = mapping__rs_reserve(&st->stale[x], 1)) || (status = mapping__rs_reserve(&st->modified[y], 1)))
        return status;
    if (discard && x == MIRROR_GPU && st->n_features)
        mapping__mirror_hook_cpu_diverged(st, lo, hi); /* the CPU's dropped writes differ from what was agreed */
    if (discard)
        mapping__rs_remove(&st->modified[y], lo, hi);
    mapping__rs_add(&st->stale[y], lo, hi);
    mapping__rs_add(&st->modified[x], lo, hi);
    mapping__rs_remove(&st->stale[x], lo, hi);
    return MAPPING_OK;
}

mapping_status mapping__mirror_mark(const char *fn, mirror_state *st, int x, size_t lo, size_t hi, bool discard)
{
    if (__builtin_expect(st->n_features != 0, 0))
        mapping__mirror_hook_marked(st, x, lo, hi, discard);
    return mark_sets(fn, st, x, lo, hi, discard);
}

mapping_status mapping__mirror_mark_ordered(const char *fn, mirror_state *st, int x, size_t lo, size_t hi)
{
    mapping_status status;
    if (st->queue.n && (status = mapping__mirror_order(st, NULL, lo, hi, MIRROR_ACCESS)))
        return status;
    if (__builtin_expect(st->n_features == 0, 1) && mapping__mirror_log_append(st, x, lo, hi))
        return MAPPING_OK;
    return mapping__mirror_mark(fn, st, x, lo, hi, false);
}

/* ---- CPU writes found by a feature (write tracking) ---- */

/* A tracked write to bytes stale on the CPU: the device modified them and
 * they were not synced back, so the write conflicts, as a CPU mark there
 * would. It cannot be refused (it happened): it is counted, and the
 * device's content wins (the next sync to the CPU overwrites it). */
static void cpu_write_conflicts(const char *fn, mirror_state *st, size_t lo, size_t hi)
{
    mapping__count(&st->dev->counters.conflicts, 1);
    mapping__mirror_hook_cpu_diverged(st, lo, hi);
    mapping__log(1,
                 "%s: MAPPING_MIRROR_TRACK_WRITES: the CPU wrote [%zu, %zu), which the GPU side modified and was not "
                 "synced back (a conflict): the device's bytes win at the next sync to the CPU",
                 fn, lo, hi);
}

/* The CPU changed [lo, hi): marks where it is valid on the CPU, a
 * conflict where it is stale there. Queued work on it was ordered first. */
static mapping_status apply_cpu_write(const char *fn, mirror_state *st, size_t lo, size_t hi)
{
    mapping_rs_cursor c;
    mapping_range r;
    mapping_status status = MAPPING_OK;
    bool ok = mapping__rs_seek(&st->stale[MIRROR_CPU], lo, &c, &r);
    while (lo < hi && status == MAPPING_OK) {
        size_t end = ok && r.lo < hi ? r.lo : hi; /* [lo, end) is valid on the CPU */
        if (end > lo && !mapping__mirror_log_append(st, MIRROR_CPU, lo, end))
            status = mark_sets(fn, st, MIRROR_CPU, lo, end, false); /* the write is done: no hook opens pages for it */
        if (!ok || r.lo >= hi)
            break;
        size_t stale_hi = r.hi < hi ? r.hi : hi;
        if (stale_hi > (r.lo > lo ? r.lo : lo))
            cpu_write_conflicts(fn, st, r.lo > lo ? r.lo : lo, stale_hi);
        lo = stale_hi;
        ok = mapping__rs_next(&c, &r);
    }
    return status;
}

static mapping_status apply_cpu_writes(const char *fn, mirror_state *st, const mapping_range *v, size_t n)
{
    /* The log may hold GPU marks (stale on the CPU); the CPU marks this
     * loop logs are of bytes valid on the CPU, which stale[CPU] is right
     * about without them. */
    mapping_status status = mapping__mirror_log_flush(st);
    for (size_t i = 0; i < n && status == MAPPING_OK; i++) {
        /* As a mark: queued work on these bytes comes first (a queued copy
         * folded later would make them valid over the new content). */
        if (st->queue.n && (status = mapping__mirror_order(st, NULL, v[i].lo, v[i].hi, MIRROR_ACCESS)))
            break;
        status = apply_cpu_write(fn, st, v[i].lo, v[i].hi);
    }
    return status;
}

/* The features' call_begin, in order; on a failure the ends of those
 * begun, last first. */
static mapping_status call_begin(const char *fn, mirror_state *st)
{
    for (int i = 0; i < st->n_features; i++) {
        const mirror_feature *f = st->features[i];
        mapping_status status = f->call_begin ? f->call_begin(fn, st) : MAPPING_OK;
        if (status == MAPPING_OK)
            continue;
        while (i-- > 0)
            if (st->features[i]->call_end)
                st->features[i]->call_end(st);
        return status;
    }
    return MAPPING_OK;
}

void mapping__mirror_leave(mirror_state *st)
{
    for (int i = st->n_features; i-- > 0;)
        if (st->features[i]->call_end)
            st->features[i]->call_end(st);
}

mapping_status mapping__mirror_enter(const char *fn, mirror_state *st, bool upload)
{
    mapping_status status = call_begin(fn, st);
    if (status == MAPPING_OK && (status = mapping__mirror_collect(fn, st, upload)) != MAPPING_OK)
        mapping__mirror_leave(st);
    return status;
}

mapping_status mapping__mirror_collect(const char *fn, mirror_state *st, bool upload)
{
    /* Copies that completed are folded first: their bytes are the
     * program's to write from then on (a collect skips bytes still queued). */
    if (st->queue.n)
        mapping__mirror_fold_completed(st);
    for (int i = 0; i < st->n_features; i++) {
        const mirror_feature *f = st->features[i];
        if (!f->collect)
            continue;
        mapping_range *v = NULL;
        size_t n = 0;
        mapping_status status = f->collect(fn, st, upload, &v, &n);
        if (status == MAPPING_OK && n)
            status = apply_cpu_writes(fn, st, v, n);
        free(v);
        if (status != MAPPING_OK)
            return status;
    }
    return MAPPING_OK;
}

/* ---- eviction: the device side goes ---- */

mapping_status mapping__mirror_state_evicted(const char *fn, mirror_state *st)
{
    mapping_status status;
    if ((status = mapping__mirror_log_flush(st)))
        return status;
    if (st->queue.n || st->stale[MIRROR_CPU].count)
        return mapping__fail(MAPPING_ERR_INTERNAL, "%s: an eviction with %s", fn,
                             st->queue.n ? "work queued on the mirror" : "bytes stale on the CPU");
    /* One range: reserve it first, the rest cannot fail. */
    if ((status = mapping__rs_reserve(&st->stale[MIRROR_GPU], 1)))
        return status;
    for (int i = 0; i < st->n_features; i++)
        if (st->features[i]->evicted)
            st->features[i]->evicted(st);
    mapping__rs_add(&st->stale[MIRROR_GPU], 0, st->size);
    mapping__rs_free(&st->modified[MIRROR_GPU]); /* written back: seen by the CPU */
    mapping__rs_free(&st->pending[MIRROR_GPU]);
    mapping__rs_free(&st->pending[MIRROR_CPU]);
    return MAPPING_OK;
}

/* ---- copies that completed ---- */

/* In this order, so that a failure part-way (out of memory) keeps
 * modified ⊆ stale and is simply redone later (every step is idempotent). */
mapping_status mapping__mirror_apply_valid(mirror_state *st, int t, const mapping_range *v, size_t n)
{
    mapping_status status;
    if ((status = mapping__mirror_log_flush(st)) || (status = mapping__rs_remove_sorted(&st->modified[1 - t], v, n)) ||
        (status = mapping__rs_remove_sorted(&st->stale[t], v, n)) ||
        (status = mapping__rs_remove_sorted(&st->pending[t], v, n)))
        return status;
    return MAPPING_OK;
}

/* Applies a completed entry. False (entry kept, to be retried) when memory
 * for the result is short. */
static bool entry_fold(mirror_state *st, size_t i)
{
    mirror_inflight *e = &st->queue.v[i];
    if (e->target != MIRROR_ACCESS && mapping__mirror_apply_valid(st, e->target, e->ranges, e->n) != MAPPING_OK)
        return false;
    mapping__mirror_queue_release(&st->queue, i);
    return true;
}

/* The copy completed but its result could not be recorded (out of memory):
 * the target stays stale (its bytes are not trusted), and the range is no
 * longer queued. */
static void entry_abandon(mirror_state *st, size_t i)
{
    mirror_inflight *e = &st->queue.v[i];
    mapping__mirror_log_flush(st); /* out of memory: the log stays, applied later */
    if (e->target != MIRROR_ACCESS)
        mapping__rs_remove_sorted(&st->pending[e->target], e->ranges, e->n);
    mapping__mirror_queue_release(&st->queue, i);
}

void mapping__mirror_fold_completed(mirror_state *st)
{
    /* Only an opportunity: a query that fails leaves the entry to be waited
     * for later, and records nothing for the caller. */
    mapping_error_mark before;
    mapping__error_mark(&before);
    for (size_t i = 0; i < st->queue.n;) {
        if (mapping__event_query(st->queue.v[i].event) == MAPPING_OK && entry_fold(st, i))
            continue;
        i++;
    }
    mapping__error_forget(&before);
}

/* Waits for entry i and folds it (the entry is gone). If the wait fails the
 * entry stays: its work may still run, so later calls stay ordered after it
 * and wait for it again. From a host function on the entry's stream, with
 * the entry queued after the function, the wait would never end:
 * MAPPING_ERR_BUSY instead (mapping__event_wait). */
static mapping_status entry_wait(mirror_state *st, size_t i)
{
    mapping_status status =
        mapping__event_wait("mirror: waiting for a copy queued on the stream", st->queue.v[i].event);
    if (status != MAPPING_OK)
        return status;
    if (!entry_fold(st, i)) {
        entry_abandon(st, i);
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror: out of memory folding a completed copy");
    }
    return MAPPING_OK;
}

mapping_status mapping__mirror_order(mirror_state *st, mapping_stream *stream, size_t lo, size_t hi, int wait_target)
{
    mapping_status first = MAPPING_OK;
    if (st->queue.n)
        mapping__mirror_fold_completed(st);
    for (size_t i = 0; i < st->queue.n;) {
        mirror_inflight *e = &st->queue.v[i];
        mapping_status status = MAPPING_OK;
        if (e->hi <= lo || e->lo >= hi) {
            i++;
        } else if (!stream || (wait_target != MIRROR_ACCESS && e->target == wait_target)) {
            size_t before = st->queue.n;
            status = entry_wait(st, i); /* removes entry i, unless its wait failed */
            i += st->queue.n == before;
        } else {
            if (e->stream != stream)
                status = mapping__stream_wait_event(stream, e->event);
            i++;
        }
        if (status && !first)
            first = status;
    }
    return first;
}

mapping_status mapping__mirror_drain(mirror_state *st)
{
    mapping_status first = MAPPING_OK;
    while (st->queue.n) {
        mapping_status status = mapping__event_synchronize(st->queue.v[0].event);
        if (status != MAPPING_OK) /* a second try */
            status = mapping__event_synchronize(st->queue.v[0].event);
        if (status != MAPPING_OK && first == MAPPING_OK)
            first = status;
        mapping__mirror_queue_release(&st->queue, 0);
    }
    return first;
}

/* ---- the features' hooks ---- */

void mapping__mirror_hook_marked(mirror_state *st, int x, size_t lo, size_t hi, bool discard)
{
    for (int i = 0; i < st->n_features; i++)
        if (st->features[i]->marked)
            st->features[i]->marked(st, x, lo, hi, discard);
}

void mapping__mirror_hook_cpu_diverged(mirror_state *st, size_t lo, size_t hi)
{
    for (int i = 0; i < st->n_features; i++)
        if (st->features[i]->cpu_diverged)
            st->features[i]->cpu_diverged(st, lo, hi);
}

mapping_status mapping__mirror_hook_before_sync(const char *fn, mapping_stream *stream, mirror_state *st, int t,
                                                size_t lo, size_t hi)
{
    mapping_status status = MAPPING_OK;
    for (int i = 0; i < st->n_features && status == MAPPING_OK; i++)
        if (st->features[i]->before_sync)
            status = st->features[i]->before_sync(fn, stream, st, t, lo, hi);
    return status;
}

mapping_status mapping__mirror_hook_refine(mapping_stream *stream, mirror_state *st, sync_plan *p)
{
    mapping_status status = MAPPING_OK;
    for (int i = 0; i < st->n_features && status == MAPPING_OK; i++)
        if (st->features[i]->refine)
            status = st->features[i]->refine(stream, st, p);
    return status;
}

const mirror_feature *mapping__mirror_hook_copier(const mirror_state *st)
{
    for (int i = 0; i < st->n_features; i++)
        if (st->features[i]->copy)
            return st->features[i];
    return NULL;
}

void mapping__mirror_hook_before_copy(mapping_stream *stream, mirror_state *st, int t, const mapping_range *v, size_t n)
{
    for (int i = 0; i < st->n_features; i++)
        if (st->features[i]->before_copy)
            st->features[i]->before_copy(stream, st, t, v, n);
}

mapping_status mapping__mirror_hook_copied(mapping_stream *stream, mirror_state *st, const sync_plan *p,
                                           mapping_status status)
{
    mapping_status first = MAPPING_OK;
    for (int i = 0; i < st->n_features; i++) {
        if (!st->features[i]->copied)
            continue;
        mapping_status s = st->features[i]->copied(stream, st, p, status);
        if (s != MAPPING_OK && first == MAPPING_OK)
            first = s;
    }
    return first;
}

void mapping__mirror_hook_synced(mapping_stream *stream, mirror_state *st, int t, size_t lo, size_t hi,
                                 size_t moved)
{
    for (int i = 0; i < st->n_features; i++)
        if (st->features[i]->synced)
            st->features[i]->synced(stream, st, t, lo, hi, moved);
}

mapping_status mapping__mirror_hook_device_use(const char *fn, mirror_state *st, int use)
{
    mapping_status status = MAPPING_OK;
    for (int i = 0; i < st->n_features && status == MAPPING_OK; i++)
        if (st->features[i]->device_use)
            status = st->features[i]->device_use(fn, st, use);
    return status;
}
