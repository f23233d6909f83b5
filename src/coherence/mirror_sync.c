/*
 * Syncing a mirror: which ranges are stale, which neighbours to merge into
 * one copy (by the device's measured link), and the copy step itself. The
 * in-flight copies that make the state follow the stream are
 * mirror_inflight.c's.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "coherence/mirror_internal.h"
#include "coherence/mirror_observe.h"
#include "transfer/transfer.h"
#include "core/ops.h"

/* ---- which ranges to copy ---- */

/* (stale[t] minus pending[t]) within [lo, hi): the exact ranges to copy.
 * Returns a malloc'd array (NULL with *n == 0 when nothing). */
static mapping_status exact_ranges(const mirror_state *st, int t, size_t lo, size_t hi, mapping_range **out, size_t *n)
{
    const mapping_range_set *stale = &st->stale[t], *pend = &st->pending[t];
    mapping_rs_cursor c0, c, p;
    mapping_range r0 = {0, 0}, r, q;
    size_t count = 0;
    bool any = mapping__rs_seek(stale, lo, &c0, &r0);
    c = c0;
    r = r0;
    for (bool ok = any; ok && r.lo < hi; ok = mapping__rs_next(&c, &r))
        count++;
    *out = NULL;
    *n = 0;
    if (!count)
        return MAPPING_OK;
    /* Each pending range can split one stale range in two. */
    size_t cap = count + mapping__rs_count(pend);
    mapping_range *v = mapping_os_malloc(cap * sizeof *v);
    if (!v)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror: out of memory listing stale ranges");
    size_t k = 0;
    c = c0;
    r = r0;
    for (bool ok = any; ok && r.lo < hi; ok = mapping__rs_next(&c, &r)) {
        size_t a = r.lo > lo ? r.lo : lo;
        size_t b = r.hi < hi ? r.hi : hi;
        /* Subtract the pending ranges inside [a, b). */
        for (bool okp = mapping__rs_seek(pend, a, &p, &q); okp && q.lo < b && a < b; okp = mapping__rs_next(&p, &q)) {
            if (q.lo > a)
                v[k++] = (mapping_range){a, q.lo};
            a = q.hi;
        }
        if (a < b)
            v[k++] = (mapping_range){a, b};
    }
    if (k == 0) { /* everything stale here is already queued */
        free(v);
        v = NULL;
    }
    *out = v;
    *n = k;
    return MAPPING_OK;
}

/* From this many ranges on, a sync packs them through the batch machinery
 * (the transfer layer, below this one): one staged transfer and a device-side
 * scatter instead of one driver transfer per range. Below it, separate
 * copies cost less than packing does. */
enum { MIRROR_BATCH_MIN_RANGES = 16 };
/* In a batch another range costs a table entry and a few bytes of staging
 * alignment, not a transfer: only gaps about that small are worth copying. */
enum { MIRROR_BATCH_MERGE_GAP = 64 };
/* Without a device-side scatter (one device copy per staged range), packing
 * only pays on a link whose per-transfer cost exceeds what a pack costs. */
#define MIRROR_BATCH_MIN_LATENCY 1e-6

/* Does a sync of n ranges go through a batch? Many ranges, and either a
 * back end that scatters and gathers on the device (a packed range then
 * costs ~10-16 ns on the CPU, a separate transfer at least the library's
 * and the driver's per-call work: 1,000 ranges on the host back end sync in
 * 18-29 us packed against 46-78 us one by one) or a slow link. */
static bool use_batch(mirror_state *st, size_t n, const mapping_link *link)
{
    if (st->unified || n < MIRROR_BATCH_MIN_RANGES)
        return false;
    return (mapping__can_scatter(st->dev) && mapping__can_gather(st->dev)) || link->latency >= MIRROR_BATCH_MIN_LATENCY;
}

/* The smallest gap not worth copying to save one range, in bytes (0: no
 * gap is): for separate copies, what one more transfer costs (latency x
 * bandwidth of the measured link); for ranges that will go through a
 * batch, a table entry's worth. */
static size_t merge_gap_limit(mirror_state *st, size_t n, const mapping_link *link)
{
    if (use_batch(st, n, link))
        return MIRROR_BATCH_MERGE_GAP;
    double bytes = link->bandwidth > 0 ? link->latency * link->bandwidth : 0;
    if (!(bytes > 0))
        return 0;
    if (bytes >= (double)SIZE_MAX)
        return SIZE_MAX;
    size_t limit = (size_t)bytes; /* a gap merges when gap < bytes: gap < ceil(bytes) */
    return limit + ((double)limit < bytes);
}

/* The run of v[i] and the neighbours after it that merge into one copy: each
 * gap below `limit` bytes and valid on the source s (copying a gap must never
 * carry stale source bytes over valid target bytes). Returns the index after
 * the run; *hi is its end. */
static size_t merge_run(const mirror_state *st, int s, const mapping_range *v, size_t n, size_t i, size_t limit,
                        size_t *hi)
{
    bool any_stale = st->stale[s].count != 0; /* else every gap is valid on the source */
    size_t end = v[i].hi;
    for (i++; i < n && v[i].lo - end < limit && !(any_stale && mapping__rs_intersects(&st->stale[s], end, v[i].lo));
         i++)
        end = v[i].hi;
    *hi = end;
    return i;
}

/* Merges neighbours into one copy (merge_run), in place; returns the count. */
static size_t merge_ranges(mirror_state *st, int s, mapping_range *v, size_t n, size_t limit)
{
    size_t k = 0;
    for (size_t i = 0, hi; i < n; k++) {
        size_t next = merge_run(st, s, v, n, i, limit, &hi);
        v[k] = (mapping_range){v[i].lo, hi}; /* k <= i: the run was read first */
        i = next;
    }
    return k;
}

/* ---- the copy step ---- */

/* Sends a list of ranges (host offsets; the buffer's are gpu_base higher)
 * through the mirror's batch. *done = n either way: on failure some may be
 * done or queued, later work orders after all of them, and none becomes
 * valid (they are recopied by the next sync). A list sorted, disjoint and
 * within the mirror (what a sync of the log sends) whose longest range is
 * `largest` bytes is not checked again on the way
 * (mapping__transfer_sorted_ranges); largest = SIZE_MAX: not known, every
 * range is checked (send_list). */
static mapping_status send_sorted_list(mapping_stream *stream, mirror_state *st, int target, const mapping_range *list,
                                       size_t n, size_t largest, size_t *done)
{
    *done = 0;
    mapping_status status;
    if (!st->batch && (status = mapping__batch_create(st->dev, &st->batch)) != MAPPING_OK)
        return status;
    bool to_gpu = target == MIRROR_GPU;
    status = largest == SIZE_MAX
                 ? mapping__transfer_ranges(stream, st->batch, to_gpu, st->cpu, st->gpu, st->gpu_base, list, n)
                 : mapping__transfer_sorted_ranges(stream, st->batch, to_gpu, st->cpu, st->gpu, st->gpu_base, list, n,
                                                   largest);
    if (status != MAPPING_OK)
        mapping__batch_clear(st->batch);
    *done = n;
    return status;
}

/* A sync's copy list is always sorted, disjoint and within the mirror (the
 * plan's merged ranges, a diff's refined ones): the ranges were checked
 * when they were marked, so only the longest is found here, and the batch
 * layer does not check them again (mapping__transfer_sorted_ranges). */
static mapping_status send_list(mapping_stream *stream, mirror_state *st, int target, const mapping_range *list,
                                size_t n, size_t *done)
{
    size_t largest = 0;
    for (size_t i = 0; i < n; i++)
        largest = list[i].hi - list[i].lo > largest ? list[i].hi - list[i].lo : largest;
    return send_sorted_list(stream, st, target, list, n, largest, done);
}

/* Wrapped CPU memory (mapping_mirror_wrap, _adopt) is the caller's, and
 * may be read-only: a const array, a PROT_READ mapping, a read-only view.
 * Uploading from it is fine; the first copy into it asks the kernel's list
 * of mappings whether all of it is writable (once per mirror, ~10-200 us),
 * so that such memory fails the sync with a status instead of faulting in
 * the copy. A tracked wrap was asked when its tracking began. */
static mapping_status check_cpu_writable(mirror_state *st, int target)
{
    if (target != MIRROR_CPU || st->owns_cpu || st->unified || st->cpu_writable)
        return MAPPING_OK;
    int rc = mapping_os_range_access((uintptr_t)st->cpu, (uintptr_t)st->cpu + st->size, PROT_WRITE, NULL);
    if (rc == 0 || rc == -ENOENT) { /* no list to ask: taken as writable, as before */
        st->cpu_writable = true;
        return MAPPING_OK;
    }
    return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                         "mirror sync to the CPU: the wrapped memory [%p, +%zu) is %s; nothing was copied into it",
                         (void *)st->cpu, st->size,
                         rc == -EACCES ? "not writable in part or whole (a read-only mapping or constant data)"
                                       : "not mapped in part or whole (freed or unmapped since it was wrapped?)");
}

mapping_status mapping__mirror_copy_ranges(mapping_stream *stream, mirror_state *st, int target,
                                           const mapping_range *ranges, size_t n, size_t *done)
{
    *done = 0;
    mapping_status status = check_cpu_writable(st, target);
    if (status)
        return status;
    /* A blocking copy into a tracked CPU side under mprotect: its pages are
     * made writable first (and count as written, as the faults would have
     * counted them; the whole pages are forgotten once it is done,
     * mapping__mirror_track_copied). Else the copy faults page by page,
     * and on a thread that blocks SIGSEGV (the caller's, or a driver's
     * thread made by it) the kernel kills the process instead. */
    if (!stream && st->track && target == MIRROR_CPU)
        for (size_t i = 0; i < n; i++)
            mapping__mirror_track_marked(st, ranges[i].lo, ranges[i].hi);
    if (st->unified)
        return mapping__mirror_prefetch(stream, st, target, ranges, n, done);
    mapping_link link = {0, 0};
    if (n >= MIRROR_BATCH_MIN_RANGES && mapping__device_link(st->dev, &link) == MAPPING_OK && use_batch(st, n, &link))
        return send_list(stream, st, target, ranges, n, done);
    for (*done = 0; *done < n; ++*done) {
        const mapping_range *r = &ranges[*done];
        status = target == MIRROR_GPU
                     ? mapping__write(stream, st->cpu + r->lo, st->gpu, st->gpu_base + r->lo, r->hi - r->lo)
                     : mapping__read(stream, st->gpu, st->gpu_base + r->lo, st->cpu + r->lo, r->hi - r->lo);
        if (status != MAPPING_OK)
            return status;
    }
    return MAPPING_OK;
}

/* ---- sync ---- */

/* The payload counters (mapping_stats): stale bytes a sync made valid. */
static void count_payload(mirror_state *st, int t, const mapping_range *v, size_t n)
{
    if (st->unified)
        return;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += v[i].hi - v[i].lo;
    mapping__count(t == MIRROR_GPU ? &st->dev->counters.h2d_payload_bytes : &st->dev->counters.d2h_payload_bytes,
                   bytes);
}

/* What a sync of [lo, hi) to side t copies: the exact stale ranges (which
 * become valid) and the same ranges with small gaps merged (which are
 * copied; `moved` bytes in all). */
typedef struct sync_plan {
    mapping_range *exact, *merged;
    size_t         n_exact, n_merged, moved;
} sync_plan;

static void sync_plan_free(sync_plan *p)
{
    free(p->exact);
    free(p->merged);
}

/* Fills p; p->n_exact == 0 when everything stale is already queued. With a
 * stream, reserves room for the in-flight entry and the pending ranges. */
static mapping_status sync_plan_make(const char *fn, mapping_stream *stream, mirror_state *st, int t, size_t lo,
                                     size_t hi, sync_plan *p)
{
    mapping_status status;
    *p = (sync_plan){0};
    if ((status = exact_ranges(st, t, lo, hi, &p->exact, &p->n_exact)) || p->n_exact == 0)
        return status;
    p->merged = mapping_os_malloc(p->n_exact * sizeof *p->merged);
    if (!p->merged)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    if (stream && ((status = mapping__mirror_inflight_reserve(st)) || (status = mapping__rs_reserve(&st->pending[t], p->n_exact))))
        return status;
    memcpy(p->merged, p->exact, p->n_exact * sizeof *p->merged);
    mapping_link link = {0, 0};
    if (p->n_exact >= 2 && mapping__device_link(st->dev, &link) != MAPPING_OK)
        link = (mapping_link){0, 0}; /* unmeasurable: no merging */
    p->n_merged = merge_ranges(st, 1 - t, p->merged, p->n_exact, merge_gap_limit(st, p->n_exact, &link));
    for (size_t k = 0; k < p->n_merged; k++)
        p->moved += p->merged[k].hi - p->merged[k].lo;
    return MAPPING_OK;
}

/* After the copies are done (no stream) or queued: the exact ranges become
 * valid now, or when the stream reaches the in-flight entry. Takes p->exact
 * when the entry does. */
static mapping_status sync_record(mapping_stream *stream, mirror_state *st, int t, sync_plan *p)
{
    mapping_status status = MAPPING_OK;
    if (!stream) {
        mapping__mirror_apply_valid(st, t, p->exact, p->n_exact, true); /* on failure the target stays stale: recopied later */
        return MAPPING_OK;
    }
    size_t span_lo = p->merged[0].lo, span_hi = p->merged[p->n_merged - 1].hi;
    mapping_error_mark before;
    mapping__error_mark(&before);
    /* A tracked CPU side forgets the copy's writes when the stream gets
     * there (before the entry's event); if that cannot be queued, wait. */
    bool waited = st->track && t == MIRROR_CPU && mapping__mirror_track_copied_on(stream, st, p->exact, p->n_exact) != MAPPING_OK;
    if (waited || mapping__mirror_entry_push(st, stream, span_lo, span_hi, t, p->exact, p->n_exact) != MAPPING_OK) {
        /* Without an event the state cannot follow the stream: wait instead
         * (the failed record is then not the caller's error). */
        if ((status = mapping__stream_synchronize(stream)) == MAPPING_OK) {
            mapping__error_forget(&before);
            /* on failure the target stays stale: recopied later */
            mapping__mirror_apply_valid(st, t, p->exact, p->n_exact, waited);
        }
        return status;
    }
    for (size_t k = 0; k < p->n_exact; k++)
        mapping__rs_add(&st->pending[t], p->exact[k].lo, p->exact[k].hi); /* reserved by sync_plan_make */
    p->exact = NULL; /* owned by the entry */
    return MAPPING_OK;
}

static mapping_status sync_checked(const char *fn, mapping_stream *stream, mapping_mirror *m, int t);

/* MAPPING_MIRROR_DEVICE_DIFF, a sync to the CPU: the plan copies only the
 * blocks that changed on the device and what its shadow does not know
 * (mirror_diff.c), merged as any plan is. */
static mapping_status diff_plan(mapping_stream *stream, mirror_state *st, sync_plan *p)
{
    mapping_range *list = NULL;
    size_t n = 0;
    mapping_status status = mapping__mirror_diff_refine(stream, st, p->exact, p->n_exact, &list, &n);
    if (status != MAPPING_OK || !list)
        return status;
    mapping_link link = {0, 0};
    if (n >= 2 && mapping__device_link(st->dev, &link) != MAPPING_OK)
        link = (mapping_link){0, 0};
    if (n)
        n = merge_ranges(st, MIRROR_GPU, list, n, merge_gap_limit(st, n, &link));
    free(p->merged);
    p->merged = list;
    p->n_merged = n;
    p->moved = 0;
    for (size_t k = 0; k < n; k++)
        p->moved += list[k].hi - list[k].lo;
    return MAPPING_OK;
}

/* What the log holds once it is written off: stale[t] and modified[1 - t]
 * are empty, the log too. */
static void log_synced(mirror_state *st, int t)
{
    mapping__rs_free(&st->stale[t]);
    mapping__rs_free(&st->modified[1 - t]);
    st->log_n = 0;
}

/* sync_whole_with_log when nothing but the log is stale on t (the common
 * case: marks since the last sync) and the ranges go through a batch: the
 * log (sorted, merged) is the list of stale ranges. It is sent as it is
 * when no gap merges (merge_run); from the first gap that does, the list is
 * written to the log's scratch (kept for the sorts: no fresh pages). The
 * log itself stays exact until the copies are done. */
static mapping_status sync_log_batched(mirror_state *st, int t, mirror_sync_report *report)
{
    int s = 1 - t;
    const mapping_range *u = st->log;
    size_t k = st->log_n;
    mapping_range *list = NULL; /* NULL while the list is the log */
    size_t n = 0, moved = 0, largest = 0;
    mapping_status status = check_cpu_writable(st, t);
    if (status)
        return status;
    for (size_t i = 0, hi; i < k; n++) {
        size_t next = merge_run(st, s, u, k, i, MIRROR_BATCH_MERGE_GAP, &hi);
        if (next != i + 1 && !list) {
            if (!st->log_scratch && !(st->log_scratch = mapping_os_malloc(st->log_cap * sizeof *st->log_scratch)))
                return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror sync: out of memory");
            list = st->log_scratch;
            memcpy(list, u, n * sizeof *list);
        }
        if (list)
            list[n] = (mapping_range){u[i].lo, hi};
        moved += hi - u[i].lo;
        largest = hi - u[i].lo > largest ? hi - u[i].lo : largest;
        i = next;
    }
    *report = (mirror_sync_report){.stale_ranges = k, .copies = n, .moved = moved};
    size_t done = 0; /* the log is sorted and merged, within the mirror: the list is too */
    status = send_sorted_list(NULL, st, t, list ? list : u, n, largest, &done);
    if (status == MAPPING_OK)
        count_payload(st, t, u, k);
    return status;
}

/* A blocking sync of the whole family to t, with marks of the other side
 * logged and nothing queued: the logged ranges need not enter the trees
 * only to leave them. The stale ranges are the tree's and the log's, merged
 * in one pass; once copied, stale[t] and modified[1 - t] are empty. Only the
 * log's effect on the source's own staleness is applied to a tree. On a
 * failed copy the log is applied as usual (nothing became valid). */
static mapping_status sync_whole_with_log(mirror_state *st, int t, mirror_sync_report *report)
{
    int s = 1 - t;
    mapping_status status;
    if ((status = mapping__mirror_log_sort(st)) ||
        (status = mapping__rs_remove_sorted(&st->stale[s], st->log, st->log_n)))
        return status;
    const mapping_range *u = st->log;
    size_t k = st->log_n, n_old = mapping__rs_count(&st->stale[t]);
    mapping_link link = {0, 0};
    if (n_old + k >= 2 && mapping__device_link(st->dev, &link) != MAPPING_OK)
        link = (mapping_link){0, 0};
    if (!n_old && use_batch(st, k, &link)) {
        if ((status = sync_log_batched(st, t, report)) != MAPPING_OK) {
            mapping__mirror_log_apply(st); /* out of memory: the log stays, applied later */
            return status;
        }
        log_synced(st, t);
        return MAPPING_OK;
    }
    mapping_range *exact = mapping_os_malloc((n_old + k) * sizeof *exact);
    if (!exact)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror sync: out of memory");
    size_t n = 0, j = 0;
    mapping_rs_cursor c;
    mapping_range r;
    bool ok = mapping__rs_seek(&st->stale[t], 0, &c, &r);
    while (ok || j < k) { /* both sorted and disjoint: a merge, joining what touches */
        mapping_range x;
        if (ok && (j >= k || r.lo <= u[j].lo)) {
            x = r;
            ok = mapping__rs_next(&c, &r);
        } else {
            x = u[j++];
        }
        if (n && x.lo <= exact[n - 1].hi) {
            if (x.hi > exact[n - 1].hi)
                exact[n - 1].hi = x.hi;
        } else {
            exact[n++] = x;
        }
    }
    mapping_range payload = {0, 0}; /* the exact bytes, before merging widens the ranges */
    for (size_t q = 0; q < n; q++)
        payload.hi += exact[q].hi - exact[q].lo;
    size_t n_merged = merge_ranges(st, s, exact, n, merge_gap_limit(st, n, &link)), done = 0;
    *report = (mirror_sync_report){.stale_ranges = n, .copies = n_merged};
    for (size_t q = 0; q < n_merged; q++)
        report->moved += exact[q].hi - exact[q].lo;
    status = mapping__mirror_copy_ranges(NULL, st, t, exact, n_merged, &done);
    free(exact);
    if (status != MAPPING_OK) {
        mapping__mirror_log_apply(st); /* out of memory: the log stays, applied later */
        return status;
    }
    count_payload(st, t, &payload, 1);
    log_synced(st, t);
    return MAPPING_OK;
}

mapping_status mapping__mirror_sync(const char *fn, mapping_stream *stream, mapping_mirror *m, int t)
{
    mapping_status status;
    if ((status = mapping__mirror_check(fn, m)) || (status = mapping__check_stream(fn, stream)) ||
        (status = mapping__check_same_device(fn, m->st->dev, stream)))
        return status;
    m->st->busy = true; /* a callback (the log) must not re-enter the family */
    status = sync_checked(fn, stream, m, t);
    m->st->busy = false;
    return status;
}

static mapping_status sync_checked(const char *fn, mapping_stream *stream, mapping_mirror *m, int t)
{
    mapping_status status;
    mirror_state *st = m->st;
    size_t lo = m->offset, hi = lo + m->size;
    /* The NULL-stream contract (mapping.h): a blocking call comes after work
     * on the device's native queue. A unified mirror's CPU side is the
     * device's memory, and no copy on that queue orders the CPU's reads. */
    if (!stream && st->unified && t == MIRROR_CPU && (status = mapping__device_synchronize(st->dev)))
        return status;
    mapping_trace_span span = mapping__trace_begin();
    /* A tracked mirror: the pages written since the last look become marks first. */
    if ((status = mapping__mirror_track_collect(fn, st, t == MIRROR_GPU)))
        return status;
    /* Not with MAPPING_CHECK=unmarked: the check reads the marked ranges, so the log must be applied.
     * Not to a tracked CPU side: its copies must pass apply_valid (mapping__mirror_track_copied).
     * Not with a device-side diff: its shadow follows every sync (mirror_diff.c). */
    if (st->log_n && st->log_side != t && !(st->track && t == MIRROR_CPU) && !stream && !st->n_inflight && !st->unified &&
        !st->diff &&
        lo == 0 && hi == st->size &&
        !mapping__rs_count(&st->pending[t]) && !mapping__mirror_check_on()) {
        mirror_sync_report report = {0};
        if ((status = sync_whole_with_log(st, t, &report)) == MAPPING_OK) {
            report.skipped = m->size > report.moved ? m->size - report.moved : 0;
            mapping__count(&st->dev->counters.sync_skipped_bytes, report.skipped);
        }
        mapping__mirror_sync_done(&span, stream, m, t, report, status);
        return status;
    }
    if ((status = mapping__mirror_log_flush(st)))
        return status;
    if (st->n_inflight)
        mapping__mirror_fold_completed(st);
    if (t == MIRROR_GPU && (status = mapping__mirror_check_unmarked(fn, st, lo, hi)))
        return status;
    /* The clean case: one binary search, nothing else. */
    if (!mapping__rs_intersects(&st->stale[t], lo, hi)) {
        mapping__count(&st->dev->counters.sync_skipped_bytes, m->size);
        mapping__mirror_sync_done(&span, stream, m, t, (mirror_sync_report){.skipped = m->size}, MAPPING_OK);
        return MAPPING_OK;
    }
    if ((status = mapping__mirror_order(st, stream, lo, hi, MIRROR_ACCESS)))
        return status;
    sync_plan plan;
    if ((status = sync_plan_make(fn, stream, st, t, lo, hi, &plan)) || plan.n_exact == 0) {
        if (status == MAPPING_OK) /* all of it is already queued */
            mapping__count(&st->dev->counters.sync_skipped_bytes, m->size);
        mapping__mirror_sync_done(&span, stream, m, t, (mirror_sync_report){.skipped = m->size}, status);
        sync_plan_free(&plan);
        return status;
    }
    if (st->diff && t == MIRROR_CPU && (status = diff_plan(stream, st, &plan))) {
        mapping__mirror_sync_done(&span, stream, m, t, (mirror_sync_report){0}, status);
        sync_plan_free(&plan);
        return status;
    }
    size_t done = 0;
    status = plan.n_merged ? mapping__mirror_copy_ranges(stream, st, t, plan.merged, plan.n_merged, &done) : MAPPING_OK;
    if (st->diff)
        mapping__mirror_diff_synced(stream, st, t, plan.exact, plan.n_exact, plan.merged, plan.n_merged, status);
    if (status != MAPPING_OK) {
        /* Nothing becomes valid; copies already queued must still order later work. */
        if (stream && done > 0)
            mapping__mirror_entry_push(st, stream, plan.merged[0].lo, plan.merged[done - 1].hi, MIRROR_ACCESS, NULL, 0);
    } else {
        size_t skipped = st->unified ? m->size - mapping__rs_bytes_in(&st->stale[t], lo, hi)
                                     : (m->size > plan.moved ? m->size - plan.moved : 0);
        mapping__count(&st->dev->counters.sync_skipped_bytes, skipped);
        /* Nothing to copy (a diff found no change): valid now, the comparison was waited for. */
        count_payload(st, t, plan.exact, plan.n_exact); /* before sync_record takes plan.exact */
        status = sync_record(plan.n_merged ? stream : NULL, st, t, &plan);
    }
    mapping__mirror_sync_done(&span, stream, m, t, (mirror_sync_report){plan.n_exact, plan.n_merged, plan.moved,
                              status == MAPPING_OK && m->size > plan.moved ? m->size - plan.moved : 0}, status);
    sync_plan_free(&plan);
    return status;
}

mapping_status mapping_mirror_sync_to_gpu(mapping_stream *stream, mapping_mirror *m)
{
    return mapping__mirror_sync("mapping_mirror_sync_to_gpu", stream, m, MIRROR_GPU);
}

mapping_status mapping_mirror_sync_to_cpu(mapping_stream *stream, mapping_mirror *m)
{
    return mapping__mirror_sync("mapping_mirror_sync_to_cpu", stream, m, MIRROR_CPU);
}
