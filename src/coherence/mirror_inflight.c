/*
 * A mirror's in-flight work: copies queued on streams (and the caller's own
 * device work between acquire_gpu and release_gpu), each an event and the
 * ranges that become valid when it completes. Later calls touching those
 * bytes order themselves after it (mapping__mirror_order): chained on
 * another stream by an event, or waited for. Completed entries are folded
 * into the state (the target's ranges become valid) whenever a call looks.
 */
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_internal.h"
#include "core/ops.h"

static void entry_release(mirror_state *st, size_t i)
{
    mirror_inflight *e = &st->inflight[i];
    mapping__event_destroy(e->event);
    free(e->ranges);
    memmove(st->inflight + i, st->inflight + i + 1, (st->n_inflight - i - 1) * sizeof *e);
    st->n_inflight--;
}

/* Makes ranges valid on t: the source's modifications there are synced,
 * the target is no longer stale, the copy no longer queued. In this order,
 * so that a failure part-way (out of memory) keeps modified ⊆ stale and is
 * simply redone later (every step is idempotent). */
mapping_status mapping__mirror_apply_valid(mirror_state *st, int t, const mapping_range *v, size_t n, bool copied_now)
{
    mapping_status status;
    if ((status = mapping__mirror_log_flush(st)) || (status = mapping__rs_remove_sorted(&st->modified[1 - t], v, n)) ||
        (status = mapping__rs_remove_sorted(&st->stale[t], v, n)) ||
        (status = mapping__rs_remove_sorted(&st->pending[t], v, n)))
        return status;
    if (__builtin_expect(st->track != NULL, 0) && t == MIRROR_CPU && copied_now)
        mapping__mirror_track_copied(st, v, n); /* the copy's writes were not the program's */
    return MAPPING_OK;
}

/* Applies a completed entry. False (entry kept, to be retried) when memory
 * for the result is short. */
static bool entry_fold(mirror_state *st, size_t i)
{
    mirror_inflight *e = &st->inflight[i];
    /* Not copied_now: a tracked CPU side forgot the copy's writes when the
     * stream got there; the program may have written there since. */
    if (e->target != MIRROR_ACCESS && mapping__mirror_apply_valid(st, e->target, e->ranges, e->n, false) != MAPPING_OK)
        return false;
    entry_release(st, i);
    return true;
}

/* The copy completed but its result could not be recorded (out of memory):
 * the target stays stale (its bytes are not trusted), and the range is no
 * longer queued. */
static void entry_abandon(mirror_state *st, size_t i)
{
    mirror_inflight *e = &st->inflight[i];
    mapping__mirror_log_flush(st); /* out of memory: the log stays, applied later */
    if (e->target != MIRROR_ACCESS)
        mapping__rs_remove_sorted(&st->pending[e->target], e->ranges, e->n);
    entry_release(st, i);
}

void mapping__mirror_fold_completed(mirror_state *st)
{
    /* Only an opportunity: a query that fails leaves the entry to be waited
     * for later, and records nothing for the caller. */
    mapping_error_mark before;
    mapping__error_mark(&before);
    for (size_t i = 0; i < st->n_inflight;) {
        if (mapping__event_query(st->inflight[i].event) == MAPPING_OK && entry_fold(st, i))
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
        mapping__event_wait("mirror: waiting for a copy queued on the stream", st->inflight[i].event);
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
    if (st->n_inflight)
        mapping__mirror_fold_completed(st);
    for (size_t i = 0; i < st->n_inflight;) {
        mirror_inflight *e = &st->inflight[i];
        if (e->hi <= lo || e->lo >= hi) {
            i++;
        } else if (!stream || (wait_target != MIRROR_ACCESS && e->target == wait_target)) {
            size_t before = st->n_inflight;
            mapping_status status = entry_wait(st, i); /* removes entry i, unless its wait failed */
            if (status && !first)
                first = status;
            if (st->n_inflight == before)
                i++;
        } else {
            if (e->stream != stream) {
                mapping_status status = mapping__stream_wait_event(stream, e->event);
                if (status && !first)
                    first = status;
            }
            i++;
        }
    }
    return first;
}

mapping_status mapping__mirror_drain(mirror_state *st)
{
    mapping_status first = MAPPING_OK;
    while (st->n_inflight) {
        mapping_status status = mapping__event_synchronize(st->inflight[0].event);
        if (status != MAPPING_OK) /* a second try */
            status = mapping__event_synchronize(st->inflight[0].event);
        if (status != MAPPING_OK && first == MAPPING_OK)
            first = status;
        entry_release(st, 0);
    }
    return first;
}

mapping_status mapping__mirror_inflight_reserve(mirror_state *st)
{
    if (st->n_inflight < st->cap_inflight)
        return MAPPING_OK;
    size_t cap = st->cap_inflight ? 2 * st->cap_inflight : 4;
    mirror_inflight *v = mapping_os_realloc(st->inflight, cap * sizeof *v);
    if (!v)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror: out of memory tracking queued copies");
    st->inflight = v;
    st->cap_inflight = cap;
    return MAPPING_OK;
}

/* Records the current end of `stream` as an entry over [lo, hi). Takes
 * ownership of ranges on success only. The caller reserved room in
 * st->inflight. */
mapping_status mapping__mirror_entry_push(mirror_state *st, mapping_stream *stream, size_t lo, size_t hi, int target,
                                 mapping_range *ranges, size_t n)
{
    mapping_event *ev;
    mapping_status status = mapping__event_record(stream, &ev);
    if (status != MAPPING_OK)
        return status;
    st->inflight[st->n_inflight++] = (mirror_inflight){ev, stream, lo, hi, target, ranges, n};
    return MAPPING_OK;
}

mapping_status mapping__mirror_record_access(mirror_state *st, mapping_stream *stream, size_t lo, size_t hi)
{
    mapping_status status = mapping__mirror_inflight_reserve(st);
    return status ? status : mapping__mirror_entry_push(st, stream, lo, hi, MIRROR_ACCESS, NULL, 0);
}

