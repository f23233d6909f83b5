/*
 * Running a flush's plan (see batch_plan.c), in this order on one stream:
 *   1. pack: copy the sources of staged host-to-device groups into the
 *      page-locked staging buffer (a host function, so it is stream-ordered);
 *   2. one write of the staging buffer (scatter tables + packed data);
 *   3. scatter on the device, one call per destination buffer (or, where the
 *      back end has no scatter, one device-side copy per group);
 *   4. host-to-device groups that go straight through;
 *   5. gather the staged device-to-host groups into the staging buffer;
 *   6. one read of the gathered data;
 *   7. unpack it to the host destinations (a host function);
 *   8. device-to-host groups that go straight through.
 * Each step records which copies it completed, so that a failure can name
 * the first copy not done and leave the rest queued.
 *
 * A blocking flush (stream NULL) runs the same steps on the device's
 * blocking stream where the back end has one, and waits once at the end
 * (finish_blocking); pack and unpack then run on this thread, before and
 * after. Small copies added in order skip the plan: batch_direct.c. Where
 * the staging is shared (mapping__staging_shared), steps 2 and 6 move
 * nothing: the device reads and writes the staging in place. The staging
 * memory itself: batch_staging.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/ops.h"
#include "transfer/transfer.h"
#include "transfer/transfer_observe.h"

static const size_t ENTRY = sizeof(mapping_scatter_entry);

static void mark_group_done(batch_plan *p, size_t g)
{
    for (size_t k = 0; k < p->groups[g].count; k++)
        p->done[p->order[p->groups[g].first + k]] = true;
}

static bool is_staged(const batch_plan *p, size_t copy, bool to_gpu)
{
    const batch_copy *c = &p->copies[copy];
    return c->to_gpu == to_gpu && p->groups[p->group_of[copy]].staged;
}

/* In add order, so that of two overlapping copies the later one wins. */
static void pack_sources(void *arg)
{
    batch_plan *p = arg;
    for (size_t i = 0; i < p->count; i++)
        if (is_staged(p, i, true)) {
            const batch_copy *c = &p->copies[i];
            const batch_group *g = &p->groups[p->group_of[i]];
            mapping__copy_small((unsigned char *)p->host_staging + g->staging_offset + (c->offset - g->lo), c->src, c->bytes);
        }
}

static void unpack_destinations(void *arg)
{
    batch_plan *p = arg;
    for (size_t i = 0; i < p->count; i++)
        if (is_staged(p, i, false)) {
            const batch_copy *c = &p->copies[i];
            const batch_group *g = &p->groups[p->group_of[i]];
            mapping__copy_small(c->dst, (unsigned char *)p->host_staging + g->staging_offset + (c->offset - g->lo), c->bytes);
        }
}

/* Scatter/gather tables, in group order: one run of entries per buffer. */
static void write_tables(batch_plan *p)
{
    mapping_scatter_entry *h2d = (mapping_scatter_entry *)(void *)(p->host_staging + p->h2d_table_offset);
    mapping_scatter_entry *d2h = (mapping_scatter_entry *)(void *)(p->host_staging + p->d2h_table_offset);
    for (size_t i = 0; i < p->group_count; i++) {
        const batch_group *g = &p->groups[i];
        if (!g->staged)
            continue;
        mapping_scatter_entry e = {g->staging_offset, g->lo, g->hi - g->lo};
        *(g->to_gpu ? h2d++ : d2h++) = e;
    }
}

/* Step 3 (to_gpu) or 5: one back-end call per buffer, or device copies. */
static mapping_status scatter_or_gather(mapping_stream *stream, mapping_batch *b, batch_plan *p, bool to_gpu)
{
    mapping_device *dev = b->dev;
    bool native = to_gpu ? mapping__can_scatter(dev) : mapping__can_gather(dev);
    size_t begin = to_gpu ? 0 : p->h2d_groups, end = to_gpu ? p->h2d_groups : p->group_count;
    if ((to_gpu ? p->h2d_staged : p->d2h_staged) == 0)
        return MAPPING_OK; /* nothing staged: no staging buffer either (host_staging may be NULL) */
    size_t table_offset = to_gpu ? p->h2d_table_offset : p->d2h_table_offset;
    const mapping_scatter_entry *table = (const mapping_scatter_entry *)(void *)(p->host_staging + table_offset);
    size_t entry = 0; /* staged groups of this direction before group i */
    for (size_t i = begin; i < end;) {
        if (!p->groups[i].staged) {
            i++;
            continue;
        }
        mapping_buffer *buf = p->groups[i].buf;
        size_t j = i, entries = 0;
        for (; j < end && p->groups[j].buf == buf; j++)
            entries += p->groups[j].staged;
        mapping_status st = MAPPING_OK;
        if (native) {
            st = to_gpu ? mapping__scatter(stream, b->dev_staging, table_offset + entry * ENTRY, table + entry,
                                           entries, buf)
                        : mapping__gather(stream, buf, b->dev_staging, table_offset + entry * ENTRY, table + entry,
                                          entries);
            if (st != MAPPING_OK)
                return st;
            if (to_gpu)
                for (size_t g = i; g < j; g++)
                    if (p->groups[g].staged)
                        mark_group_done(p, g);
        } else {
            for (size_t g = i; g < j; g++) {
                const batch_group *gr = &p->groups[g];
                if (!gr->staged)
                    continue;
                st = to_gpu ? mapping__copy(stream, b->dev_staging, gr->staging_offset, gr->buf, gr->lo, gr->hi - gr->lo)
                            : mapping__copy(stream, gr->buf, gr->lo, b->dev_staging, gr->staging_offset, gr->hi - gr->lo);
                if (st != MAPPING_OK)
                    return st;
                if (to_gpu)
                    mark_group_done(p, g);
            }
        }
        entry += entries;
        i = j;
    }
    return MAPPING_OK;
}

/* Steps 4 and 8: each copy of a straight-through group on its own, in add
 * order (groups never overlap each other, so within a group it is the order
 * that makes the later of two overlapping copies win). */
static mapping_status straight_through(mapping_stream *stream, batch_plan *p, bool to_gpu)
{
    if ((to_gpu ? p->h2d_straight : p->d2h_straight) == 0)
        return MAPPING_OK; /* not a pass over every copy for nothing */
    for (size_t i = 0; i < p->count; i++) {
        const batch_copy *c = &p->copies[i];
        if (c->to_gpu != to_gpu || p->groups[p->group_of[i]].staged)
            continue;
        mapping_status st = to_gpu ? mapping__write(stream, c->src, c->buf, c->offset, c->bytes)
                                   : mapping__read(stream, c->buf, c->offset, c->dst, c->bytes);
        if (st != MAPPING_OK)
            return st;
        p->done[i] = true;
    }
    return MAPPING_OK;
}

/* host_inline: the host steps (pack, unpack) run on this thread, the pack
 * now and the unpack left to the caller once the stream has finished (a
 * blocking flush on the device's blocking stream, which runs no host
 * function). */
static mapping_status run_plan(mapping_stream *stream, mapping_batch *b, batch_plan *p, bool host_inline)
{
    mapping_device *dev = b->dev;
    mapping_status st;
    if (p->h2d_staged || p->d2h_staged) {
        if ((st = mapping__batch_ensure_staging(b, p->staging_bytes)) != MAPPING_OK)
            return st;
        p->host_staging = b->host_staging;
        write_tables(p);
    }
    if (p->h2d_staged && host_inline)
        pack_sources(p);
    else if (p->h2d_staged && (st = mapping__launch_host(stream, pack_sources, p)) != MAPPING_OK)
        return st;
    /* Step 2: one write covering what the device needs of the staging buffer. */
    bool h2d_table = p->h2d_staged && mapping__can_scatter(dev), d2h_table = p->d2h_staged && mapping__can_gather(dev);
    size_t begin = h2d_table ? p->h2d_table_offset : d2h_table ? p->d2h_table_offset : p->h2d_data_offset;
    size_t end = p->h2d_staged ? p->d2h_data_offset : d2h_table ? p->d2h_table_offset + p->d2h_staged * ENTRY : 0;
    if (end > begin && (st = mapping__batch_stage_out(stream, b, p->host_staging + begin, begin, end - begin)) != MAPPING_OK)
        return st;
    if ((st = scatter_or_gather(stream, b, p, true)) != MAPPING_OK || (st = straight_through(stream, p, true)))
        return st;
    if (p->d2h_staged) {
        if ((st = scatter_or_gather(stream, b, p, false)) != MAPPING_OK ||
            (st = mapping__batch_stage_in(stream, b, p->d2h_data_offset, p->host_staging + p->d2h_data_offset,
                           p->staging_bytes - p->d2h_data_offset)) != MAPPING_OK ||
            (!host_inline && (st = mapping__launch_host(stream, unpack_destinations, p)) != MAPPING_OK))
            return st;
        p->d2h_read = true;
        for (size_t g = p->h2d_groups; g < p->group_count; g++)
            if (p->groups[g].staged)
                mark_group_done(p, g);
    }
    return straight_through(stream, p, false);
}

mapping_status mapping__batch_wait_queued(mapping_batch *b, mapping_stream *queue, mapping_status run, bool *waited)
{
    mapping_error_mark before;
    if (run != MAPPING_OK)
        mapping__error_mark(&before); /* the run's error explains a failed wait too: it is kept */
    mapping_status st = mapping__stream_synchronize(queue);
    *waited = st == MAPPING_OK;
    if (!*waited) {
        b->unwaited = queue; /* the steps may still run: the next use of the staging waits again */
        if (run == MAPPING_OK) {
            char inner[384];
            snprintf(inner, sizeof inner, "%s", mapping__last_message());
            return mapping__fail(st, "waiting for the queued steps failed (%s); which copies completed is unknown, "
                                     "so every copy stays queued", inner);
        }
    }
    if (run != MAPPING_OK)
        mapping__error_forget(&before);
    return run;
}

/* A flush run on the blocking stream: waits for what was queued, then
 * unpacks what was gathered (even if a later step failed). When the wait
 * fails, no copy is known to be done: all stay queued (doing a copy twice
 * is harmless). */
static mapping_status finish_blocking(mapping_batch *b, mapping_stream *queue, batch_plan *p, mapping_status run,
                                      bool direct)
{
    bool waited;
    mapping_status st = mapping__batch_wait_queued(b, queue, run, &waited);
    if (!waited)
        memset(p->done, 0, p->count * sizeof *p->done);
    else if (p->d2h_read && direct)
        mapping__batch_direct_unpack(p);
    else if (p->d2h_read)
        unpack_destinations(p);
    return st;
}

/* Names the first copy not done, and leaves exactly those queued. */
static mapping_status report_failure(mapping_batch *b, const batch_plan *p, mapping_status st)
{
    char inner[384];
    snprintf(inner, sizeof inner, "%s", mapping__last_message());
    size_t first = p->count, done = 0;
    mapping__batch_clear(b);
    for (size_t i = 0; i < p->count; i++) {
        if (p->done[i]) {
            done++;
            continue;
        }
        if (first == p->count)
            first = i;
        b->copies[b->count++] = p->copies[i]; /* capacity >= p->count: see mapping__batch_plan */
        b->payload[p->copies[i].to_gpu] += p->copies[i].bytes;
        if (p->copies[i].bytes > b->largest)
            b->largest = p->copies[i].bytes;
    }
    b->unsorted = mapping__batch_sorted_prefix(b->copies, b->count) < b->count;
    if (done)
        mapping__count(&b->dev->counters.batch_flushes, 1);
    const batch_copy *c = &p->copies[first < p->count ? first : 0];
    return mapping__fail(st,
                         "mapping_batch_flush: copy %zu of %zu (%s, %zu bytes at offset %zu of buffer %p) was not done: "
                         "%s; %zu copies done, %zu not done and still queued",
                         first, p->count, c->to_gpu ? "host-to-device" : "device-to-host", c->bytes, c->offset,
                         (void *)c->buf, inner, done, p->count - done);
}

/* The previous flush could not be waited for: nothing was done. */
static mapping_status report_not_started(mapping_batch *b, mapping_status st)
{
    char inner[384];
    snprintf(inner, sizeof inner, "%s", mapping__last_message());
    const batch_copy *c = &b->copies[0];
    return mapping__fail(st,
                         "mapping_batch_flush: copy 0 of %zu (%s, %zu bytes at offset %zu of buffer %p) was not done: "
                         "waiting for the previous flush failed: %s; 0 copies done, %zu not done and still queued",
                         b->count, c->to_gpu ? "host-to-device" : "device-to-host", c->bytes, c->offset,
                         (void *)c->buf, inner, b->count);
}

mapping_status mapping__batch_flush(mapping_stream *stream, mapping_batch *b)
{
    if (b->count == 0)
        return MAPPING_OK;
    /* The last flush's work may still read its plan and staging. */
    mapping_status st = mapping__batch_wait_pending(b);
    if (st != MAPPING_OK)
        return report_not_started(b, st);
    /* Blocking: where the back end has a blocking stream, every step is
     * queued there and waited for once, rather than each step waiting. */
    mapping_stream *queue = stream ? NULL : mapping__blocking_stream(b->dev);
    /* Blocking, small copies in order: the one-pass flush (batch_direct.c),
     * or on a device whose memory is the CPU's, its copies through mapped
     * memory, run by run. Blocking on such a device otherwise: copies
     * through mapped memory in add order (batch_mapped.c). */
    bool can_map = !stream && mapping__can_map(b->dev);
    bool direct = !stream && mapping__batch_direct_fits(b);
    bool mapped_any = can_map && !direct && mapping__batch_mapped_fits(b);
    bool mapped = mapped_any || (can_map && direct);
    batch_plan *p = &b->plan;
    if (mapped || direct) {
        st = mapping__batch_plan_take(b, p);
    } else {
        /* Only a copy of BATCH_LARGE_MIN bytes or more can go straight through. */
        size_t large = b->largest >= BATCH_LARGE_MIN ? mapping__batch_large_bytes(b->dev) : BATCH_LARGE_MIN;
        st = mapping__batch_plan(b, p, large);
    }
    if (st != MAPPING_OK)
        return st;
    b->busy = true; /* a callback (the log) must not re-enter this batch */
    mapping_trace_span span = mapping__trace_begin();
    mapping_status run = mapped_any ? mapping__batch_mapped_any(b, p)
                         : mapped   ? mapping__batch_mapped_runs(b, p)
                         : direct   ? mapping__batch_direct_run(queue, b, p)
                                    : run_plan(queue ? queue : stream, b, p, queue != NULL);
    if (queue && !mapped) /* a mapped run has nothing queued: its map and unmap block */
        run = finish_blocking(b, queue, p, run, direct);
    mapping__batch_flush_done(&span, stream, b, p, run);
    b->busy = false;
    mapping_error_mark before;
    mapping__error_mark(&before);
    if (stream && (st = mapping__event_record(stream, &b->pending)) != MAPPING_OK) {
        /* Without an event we cannot tell when the plan is free: wait now.
         * The flush itself is queued; the stream reports its own failures. */
        mapping__stream_synchronize(stream);
        b->pending = NULL;
        mapping__error_forget(&before);
    }
    if (run != MAPPING_OK)
        return report_failure(b, p, run);
    b->count = 0;
    mapping__count(&b->dev->counters.batch_flushes, 1);
    return MAPPING_OK;
}

mapping_status mapping_batch_flush(mapping_stream *stream, mapping_batch *b)
{
    static const char fn[] = "mapping_batch_flush";
    mapping_status st;
    if ((st = mapping__check_stream(fn, stream)) || (st = mapping__batch_check(fn, b)))
        return st;
    if ((st = mapping__check_same_device(fn, b->dev, stream)) ||
        (b->count && (st = mapping__stream_refuse_capture_why(b->dev, stream, fn,
                                                              "a flush packs the batch's host memory into staging "
                                                              "now, so every replay would move the bytes of capture "
                                                              "time"))))
        return st;
    uint64_t to_host = b->payload[0], to_device = b->payload[1];
    if ((st = mapping__batch_flush(stream, b)) == MAPPING_OK) { /* the caller's copies: payload */
        mapping__count(&b->dev->counters.h2d_payload_bytes, to_device);
        mapping__count(&b->dev->counters.d2h_payload_bytes, to_host);
    }
    return st;
}
