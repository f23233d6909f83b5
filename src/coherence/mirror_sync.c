/*
 * Syncing a mirror, in named stages:
 *   enter    the features' collect (mapping__mirror_enter, at the public call)
 *   prepare  the features' checks, the mark log applied, completed copies folded
 *   plan     the stale ranges not already queued, merged by the link (mirror_plan.c),
 *            refined by a feature (the device diff)
 *   copy     the features' before_copy, then the copy step (mirror_copy.c, or a
 *            feature's: unified memory prefetches)
 *   commit   valid now (blocking) or when the stream gets there (pending, a
 *            queued entry); the features' copied hook
 * and the report (mirror_observe.c); the public calls are mirror_sync_call.c's,
 * an eviction's write-back mapping__mirror_sync_family. A sync in which no feature takes part
 * (MIRROR_STAGES_TO_*) whose only stale ranges are marks of the other side in
 * the log takes a shorter way: the log is the list (sync_whole_with_log).
 */
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_api.h"
#include "coherence/mirror_copy.h"
#include "coherence/mirror_mark_log.h"
#include "coherence/mirror_observe.h"
#include "coherence/mirror_plan.h"
#include "coherence/mirror_queue.h"

/* The stages are inlined into both of their callers (the public sync and
 * an eviction's write-back, mapping__mirror_sync_family), so that the
 * public sync's fast paths are as they were with one caller. */
#define STAGE static inline __attribute__((always_inline))

/* ---- the fast path: marks of the other side in the log, nothing else ---- */

/* The log (sorted, merged) is the list of stale ranges: sent through a
 * batch as it is when no gap merges (merge_run); from the first gap that
 * does, the list is written to the log's scratch (kept for the sorts: no
 * fresh pages). The log itself stays exact until the copies are done. */
static mapping_status sync_log_batched(mirror_state *st, int t, mirror_sync_report *report)
{
    const mapping_range *u = st->log.v;
    size_t k = st->log.n;
    mapping_range *list = NULL; /* NULL while the list is the log */
    size_t n = 0, moved = 0, largest = 0;
    mapping_status status = mapping__mirror_check_cpu_writable(st, t);
    if (status)
        return status;
    for (size_t i = 0, hi; i < k; n++) {
        size_t next = mapping__mirror_merge_run(st, 1 - t, u, k, i, MIRROR_BATCH_MERGE_GAP, &hi);
        if (next != i + 1 && !list) {
            if (!st->log.scratch && !(st->log.scratch = mapping_os_malloc(st->log.cap * sizeof *st->log.scratch)))
                return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror sync: out of memory");
            list = st->log.scratch;
            memcpy(list, u, n * sizeof *list);
        }
        if (list)
            list[n] = (mapping_range){u[i].lo, hi};
        moved += hi - u[i].lo;
        largest = hi - u[i].lo > largest ? hi - u[i].lo : largest;
        i = next;
    }
    *report = (mirror_sync_report){.stale_ranges = k, .copies = n, .moved = moved};
    status = mapping__mirror_send_sorted(st, t, list ? list : u, n, largest);
    if (status == MAPPING_OK)
        mapping__mirror_count_payload(st, t, u, k);
    return status;
}

/* stale[t]'s ranges and the log's (both sorted and disjoint) merged into
 * one sorted list, joining what touches; NULL when out of memory. */
static mapping_range *merge_tree_and_log(const mirror_state *st, int t, size_t *n_out)
{
    const mapping_range *u = st->log.v;
    size_t k = st->log.n, n = 0, j = 0;
    mapping_range *exact = mapping_os_malloc((mapping__rs_count(&st->stale[t]) + k) * sizeof *exact);
    if (!exact)
        return NULL;
    mapping_rs_cursor c;
    mapping_range r;
    bool ok = mapping__rs_seek(&st->stale[t], 0, &c, &r);
    while (ok || j < k) {
        mapping_range x;
        if (ok && (j >= k || r.lo <= u[j].lo)) {
            x = r;
            ok = mapping__rs_next(&c, &r);
        } else {
            x = u[j++];
        }
        if (n && x.lo <= exact[n - 1].hi)
            exact[n - 1].hi = x.hi > exact[n - 1].hi ? x.hi : exact[n - 1].hi;
        else
            exact[n++] = x;
    }
    *n_out = n;
    return exact;
}

/* The log and stale[t] merged in one pass, then copied. */
static mapping_status sync_tree_and_log(mirror_state *st, int t, mirror_sync_report *report)
{
    size_t n = 0, done = 0;
    mapping_range *exact = merge_tree_and_log(st, t, &n);
    if (!exact)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror sync: out of memory");
    mapping_range payload = {0, 0}; /* the exact bytes, before merging widens the ranges */
    for (size_t q = 0; q < n; q++)
        payload.hi += exact[q].hi - exact[q].lo;
    size_t n_merged = mapping__mirror_merge(st, 1 - t, exact, n);
    *report = (mirror_sync_report){.stale_ranges = n, .copies = n_merged};
    for (size_t q = 0; q < n_merged; q++)
        report->moved += exact[q].hi - exact[q].lo;
    mapping_status status = mapping__mirror_copy_ranges(NULL, st, t, exact, n_merged, &done);
    free(exact);
    if (status == MAPPING_OK)
        mapping__mirror_count_payload(st, t, &payload, 1);
    return status;
}

/* A blocking sync of the whole family to t, with marks of the other side
 * logged and nothing queued: the logged ranges need not enter the trees
 * only to leave them. Only the log's effect on the source's own staleness
 * is applied to a tree. On a failed copy the log is applied as usual
 * (nothing became valid). */
static mapping_status sync_whole_with_log(mirror_state *st, int t, mirror_sync_report *report)
{
    mapping_status status;
    if ((status = mapping__mirror_log_sort(st)) ||
        (status = mapping__rs_remove_sorted(&st->stale[1 - t], st->log.v, st->log.n)))
        return status;
    mapping_link link = {0, 0};
    size_t n_old = mapping__rs_count(&st->stale[t]);
    if (n_old + st->log.n >= 2 && mapping__device_link(st->dev, &link) != MAPPING_OK)
        link = (mapping_link){0, 0};
    status = !n_old && mapping__mirror_use_batch(st, st->log.n, &link) ? sync_log_batched(st, t, report)
                                                                       : sync_tree_and_log(st, t, report);
    if (status != MAPPING_OK) {
        mapping__mirror_log_apply(st); /* out of memory: the log stays, applied later */
        return status;
    }
    mapping__mirror_whole_synced(st, t);
    return MAPPING_OK;
}

/* Whether the fast path may take this sync: no feature takes part in the
 * stages of a sync to t (write tracking, for one, only in those to the CPU),
 * blocking, of the whole family, whose log holds marks of the other side,
 * with nothing queued. */
static bool fast_path(const mirror_state *st, mapping_stream *stream, const mapping_mirror *m, int t)
{
    return !(st->stages & (1u << t)) && !stream && st->log.n && st->log.side != t && !st->queue.n && m->offset == 0 &&
           m->size == st->size;
}

/* ---- the stages ---- */

/* The log applied, completed copies folded, the features' checks. */
STAGE mapping_status stage_prepare(const char *fn, mapping_stream *stream, mirror_state *st, int t, size_t lo,
                                    size_t hi)
{
    mapping_status status;
    if ((status = mapping__mirror_log_flush(st)))
        return status;
    if (st->queue.n)
        mapping__mirror_fold_completed(st);
    return st->n_features ? mapping__mirror_hook_before_sync(fn, stream, st, t, lo, hi) : MAPPING_OK;
}

/* The plan, refined by the features; p->n_exact == 0: nothing to copy. */
STAGE mapping_status stage_plan(const char *fn, mapping_stream *stream, mirror_state *st, int t, size_t lo, size_t hi,
                                 sync_plan *p)
{
    mapping_status status;
    if ((status = mapping__mirror_order(st, stream, lo, hi, MIRROR_ACCESS)) ||
        (status = mapping__mirror_plan_make(fn, stream, st, t, lo, hi, p)) || p->n_exact == 0)
        return status;
    return st->n_features ? mapping__mirror_hook_refine(stream, st, p) : MAPPING_OK;
}

/* The copy step; *done: how many of the plan's copies were done or queued. */
STAGE mapping_status stage_copy(mapping_stream *stream, mirror_state *st, const sync_plan *p, size_t *done)
{
    *done = 0;
    if (!p->n_merged)
        return MAPPING_OK; /* nothing to copy (a diff found no change) */
    const mirror_feature *copier = NULL;
    if (st->n_features) {
        mapping__mirror_hook_before_copy(stream, st, p->target, p->merged, p->n_merged);
        copier = mapping__mirror_hook_copier(st);
    }
    return copier ? copier->copy(stream, st, p->target, p->merged, p->n_merged, done)
                  : mapping__mirror_copy_ranges(stream, st, p->target, p->merged, p->n_merged, done);
}

/* The exact ranges become valid now (blocking, or nothing copied), or when
 * the stream reaches a queued entry (pending until then). Takes p->exact
 * when the entry does. Without an event the state cannot follow the
 * stream: it waits for the stream instead. */
STAGE mapping_status stage_commit(mapping_stream *stream, mirror_state *st, sync_plan *p)
{
    int t = p->target;
    if (!stream || !p->n_merged) {
        mapping__mirror_apply_valid(st, t, p->exact, p->n_exact); /* on failure the target stays stale: recopied */
        return MAPPING_OK;
    }
    mapping_error_mark before;
    mapping__error_mark(&before);
    if (mapping__mirror_queue_push(&st->queue, stream, p->merged[0].lo, p->merged[p->n_merged - 1].hi, t, p->exact,
                                   p->n_exact) != MAPPING_OK) {
        mapping_status status = mapping__stream_synchronize(stream);
        if (status == MAPPING_OK) {
            mapping__error_forget(&before); /* the failed record is not the caller's error */
            mapping__mirror_apply_valid(st, t, p->exact, p->n_exact);
        }
        return status;
    }
    for (size_t k = 0; k < p->n_exact; k++)
        mapping__rs_add(&st->pending[t], p->exact[k].lo, p->exact[k].hi); /* reserved by the plan */
    p->exact = NULL; /* owned by the entry */
    return MAPPING_OK;
}

/* After the copy step: the features see what was copied, then the state
 * follows (or, on failure, only orders later work after what was queued). */
STAGE mapping_status stage_finish(mapping_stream *stream, mirror_state *st, const mapping_mirror *m, sync_plan *p,
                                   mapping_status status, size_t done)
{
    if (st->n_features) {
        mapping_status hooked = mapping__mirror_hook_copied(p->n_merged ? stream : NULL, st, p, status);
        status = status ? status : hooked;
    }
    if (status != MAPPING_OK) {
        /* Nothing becomes valid; copies already queued must still order later work. */
        if (stream && done > 0 && mapping__mirror_queue_reserve(&st->queue) == MAPPING_OK)
            mapping__mirror_queue_push(&st->queue, stream, p->merged[0].lo, p->merged[done - 1].hi, MIRROR_ACCESS,
                                       NULL, 0);
        return status;
    }
    size_t skipped = st->unified ? m->size - mapping__rs_bytes_in(&st->stale[p->target], m->offset, m->offset + m->size)
                                 : (m->size > p->moved ? m->size - p->moved : 0);
    mapping__count(&st->dev->counters.sync_skipped_bytes, skipped);
    mapping__mirror_count_payload(st, p->target, p->exact, p->n_exact); /* before the commit takes p->exact */
    return stage_commit(stream, st, p);
}

STAGE mapping_status sync_stages(const char *fn, mapping_stream *stream, mapping_mirror *m, int t,
                                  mirror_sync_report *report)
{
    mirror_state *st = m->st;
    size_t lo = m->offset, hi = lo + m->size, done = 0;
    mapping_status status = stage_prepare(fn, stream, st, t, lo, hi);
    if (status)
        return status;
    if (!mapping__rs_intersects(&st->stale[t], lo, hi)) { /* the clean case: one binary search */
        mapping__count(&st->dev->counters.sync_skipped_bytes, m->size);
        report->skipped = m->size;
        return MAPPING_OK;
    }
    sync_plan plan = {.target = t};
    if ((status = stage_plan(fn, stream, st, t, lo, hi, &plan)) || plan.n_exact == 0) {
        if (status == MAPPING_OK) /* all of it is already queued */
            mapping__count(&st->dev->counters.sync_skipped_bytes, m->size);
        report->skipped = status == MAPPING_OK ? m->size : 0;
        mapping__mirror_plan_free(&plan);
        return status;
    }
    status = stage_copy(stream, st, &plan, &done);
    *report = (mirror_sync_report){plan.n_exact, plan.n_merged, plan.moved, 0};
    status = stage_finish(stream, st, m, &plan, status, done);
    if (status == MAPPING_OK)
        report->skipped = m->size > plan.moved ? m->size - plan.moved : 0;
    mapping__mirror_plan_free(&plan);
    return status;
}

mapping_status mapping__mirror_sync_checked(const char *fn, mapping_stream *stream, mapping_mirror *m, int t)
{
    mirror_state *st = m->st;
    mirror_sync_report report = {0};
    mapping_status status;
    mapping_trace_span span = mapping__trace_begin();
    st->busy = true; /* a callback (the log) must not re-enter the family */
    if (fast_path(st, stream, m, t)) {
        if ((status = sync_whole_with_log(st, t, &report)) == MAPPING_OK) {
            report.skipped = m->size > report.moved ? m->size - report.moved : 0;
            mapping__count(&st->dev->counters.sync_skipped_bytes, report.skipped);
        }
    } else {
        status = sync_stages(fn, stream, m, t, &report);
    }
    mapping__mirror_sync_done(&span, stream, m, t, report, status);
    if (status == MAPPING_OK && st->n_features)
        mapping__mirror_hook_synced(stream, st, t, m->offset, m->offset + m->size, report.moved);
    st->busy = false;
    return status;
}

mapping_status mapping__mirror_sync_family(const char *fn, mirror_state *st, int t)
{
    mapping_mirror whole = {st, 0, st->size}; /* not a registered handle: the stages read its range */
    mirror_sync_report report = {0};
    mapping_trace_span span = mapping__trace_begin();
    mapping_status status = sync_stages(fn, NULL, &whole, t, &report); /* not busy: see mirror_api.h */
    mapping__mirror_sync_done(&span, NULL, &whole, t, report, status);
    if (status == MAPPING_OK && st->n_features)
        mapping__mirror_hook_synced(NULL, st, t, 0, st->size, report.moved);
    return status;
}
