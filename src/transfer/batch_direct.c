/*
 * A flush in one pass: the common batch (many small copies, added in order
 * of buffer and offset, as a loop over an array adds them) needs no sort,
 * no groups and no second look at a copy. Each direction's copies are walked
 * once: touching or overlapping neighbours merge into one table entry, and
 * a host-to-device copy's bytes are packed into staging as it is met (in add
 * order, so of two overlapping copies the later one wins). Then the same
 * steps as batch_flush.c run: one write of the tables and packed bytes, one
 * scatter and one gather per buffer, one read, and the unpack.
 *
 * The staging layout is batch_flush.c's, sized by upper bounds (a table
 * entry per copy, the bytes of all copies): [h2d table | d2h table | h2d
 * data | d2h data].
 *
 * On a CPU OpenCL device, blocking flushes copy through mapped memory
 * (batch_mapped.c) unless MAPPING_BATCH_MAP=0. Then (the staging is the
 * device's memory, the queue runs on the device's threads) many
 * host-to-device copies go in pieces
 * (h2d_chunks): the device scatters one piece while this thread packs the
 * next. (Device to host in pieces, unpacking one piece while the device
 * gathers the next, needs a wait per piece; on PoCL those waits cost more
 * than the overlap gained, so device to host stays one gather, one wait.)
 */
#include "core/ops.h"
#include "transfer/transfer.h"
#include "transfer/transfer_observe.h"

static const size_t ENTRY = sizeof(mapping_scatter_entry);

bool mapping__batch_direct_fits(const mapping_batch *b)
{
    return b->largest < BATCH_LARGE_MIN && !b->unsorted && mapping__can_scatter(b->dev) && mapping__can_gather(b->dev);
}

/* Copies [begin, end) of one direction: merged into table entries from
 * `table`, their bytes at data (packed now when to_gpu; else order[i] says
 * where copy i will find its bytes). Returns the bytes laid out; *entries. */
static size_t lay_out(batch_plan *p, size_t begin, size_t end, mapping_scatter_entry *table, size_t data,
                      size_t *entries)
{
    size_t e = 0, at = data;
    mapping_buffer *buf = NULL;
    size_t lo = 0, hi = 0, start = 0;
    batch_run *run = NULL;
    for (size_t i = begin; i < end; i++) {
        const batch_copy *c = &p->copies[i];
        size_t pos;
        if (e && c->buf == buf && c->offset <= hi) { /* sorted: c->offset >= lo */
            pos = start + (c->offset - lo);
            if (c->offset + c->bytes > hi)
                hi = c->offset + c->bytes;
        } else {
            if (e) {
                table[e - 1] = (mapping_scatter_entry){start, lo, hi - lo};
                at = start + (hi - lo);
            }
            if (c->buf != buf || !run) {
                run = &p->runs[p->run_count++];
                *run = (batch_run){c->buf, e, 0, i, 0};
            }
            buf = c->buf;
            lo = c->offset;
            hi = lo + c->bytes;
            start = pos = at;
            e++;
        }
        run->entries = e - run->first_entry;
        run->copies = i + 1 - run->first_copy;
        if (c->to_gpu)
            mapping__copy_small((unsigned char *)p->host_staging + pos, c->src, c->bytes);
        else
            p->order[i] = pos;
    }
    if (e) {
        table[e - 1] = (mapping_scatter_entry){start, lo, hi - lo};
        at = start + (hi - lo);
    }
    *entries = e;
    return at - data;
}

/* Queues the scatter (to_gpu) or gather of runs [r0, r1), whose entries are
 * in `table` (its direction's table, at table_offset in staging). */
static mapping_status move_runs(mapping_stream *queue, mapping_batch *b, batch_plan *p, bool to_gpu, size_t r0,
                                size_t r1, const mapping_scatter_entry *table, size_t table_offset)
{
    for (size_t r = r0; r < r1; r++) {
        const batch_run *run = &p->runs[r];
        size_t at = table_offset + run->first_entry * ENTRY;
        mapping_status st = to_gpu
                                ? mapping__scatter(queue, b->dev_staging, at, table + run->first_entry, run->entries,
                                                   run->buf)
                                : mapping__gather(queue, run->buf, b->dev_staging, at, table + run->first_entry,
                                                  run->entries);
        if (st != MAPPING_OK)
            return st;
        if (to_gpu) /* device-to-host copies are done once the read is */
            memset(p->done + run->first_copy, 1, run->copies * sizeof *p->done);
    }
    return MAPPING_OK;
}

/* In how many pieces the host-to-device copies are packed and scattered.
 * Where the staging is the device's own memory (no write) and the steps go
 * to a queue that runs while this thread goes on (a CPU device: PoCL), the
 * scatter of one piece runs on the device's threads while this one packs
 * the next: a large batch then costs about its pack plus the last piece's
 * scatter, not the pack plus the whole scatter, and the device's threads
 * wake up while there is still packing to do. Elsewhere (a write to make,
 * or no queue) one piece. */
enum { CHUNK_COPIES = 2048, MAX_CHUNKS = 4 };
static size_t h2d_chunks(const mapping_batch *b, const mapping_stream *queue, size_t n_h2d)
{
    if (!queue || !b->staging_shared)
        return 1;
    size_t chunks = n_h2d / CHUNK_COPIES;
    return chunks < 1 ? 1 : chunks > MAX_CHUNKS ? MAX_CHUNKS : chunks;
}

mapping_status mapping__batch_direct_run(mapping_stream *queue, mapping_batch *b, batch_plan *p)
{
    size_t n = p->count, n_h2d = 0, h2d_bytes = 0, d2h_bytes = 0;
    while (n_h2d < n && p->copies[n_h2d].to_gpu) /* sorted: host-to-device first */
        h2d_bytes += p->copies[n_h2d++].bytes;
    for (size_t i = n_h2d; i < n; i++)
        d2h_bytes += p->copies[i].bytes;
    p->h2d_table_offset = 0;
    p->d2h_table_offset = n_h2d * ENTRY;
    p->h2d_data_offset = mapping__align_up(n * ENTRY, 64);
    p->d2h_data_offset = mapping__align_up(p->h2d_data_offset + h2d_bytes, 64);
    mapping_status st = mapping__batch_ensure_staging(b, p->d2h_data_offset + d2h_bytes);
    if (st != MAPPING_OK)
        return st;
    p->host_staging = b->host_staging;
    mapping_scatter_entry *h2d = (mapping_scatter_entry *)(void *)(p->host_staging + p->h2d_table_offset);
    mapping_scatter_entry *d2h = (mapping_scatter_entry *)(void *)(p->host_staging + p->d2h_table_offset);

    /* Host to device, piece by piece: each piece's entries and bytes follow
     * the last piece's (its copies do not merge with the last piece's: two
     * entries, scattered in queue order, the later copy still wins). */
    size_t chunks = h2d_chunks(b, queue, n_h2d), h2d_moved = 0;
    p->h2d_staged = 0;
    for (size_t c = 0; c < chunks; c++) {
        size_t first = n_h2d * c / chunks, last = n_h2d * (c + 1) / chunks, r0 = p->run_count, entries;
        size_t moved = lay_out(p, first, last, h2d + p->h2d_staged, p->h2d_data_offset + h2d_moved, &entries);
        for (size_t r = r0; r < p->run_count; r++)
            p->runs[r].first_entry += p->h2d_staged;
        p->h2d_staged += entries;
        h2d_moved += moved;
        if (chunks > 1 && (st = move_runs(queue, b, p, true, r0, p->run_count, h2d, p->h2d_table_offset)) != MAPPING_OK) {
            mapping__count_shared_transfer(b->dev, true, p->h2d_staged * ENTRY + h2d_moved);
            return st;
        }
    }
    size_t h2d_runs = p->run_count;
    size_t d2h_moved = lay_out(p, n_h2d, n, d2h, p->d2h_data_offset, &p->d2h_staged);
    p->group_count = p->h2d_groups = p->h2d_staged;
    p->group_count += p->d2h_staged;
    p->moved[0][0] = h2d_moved;
    p->moved[1][0] = d2h_moved;
    p->staging_bytes = p->d2h_data_offset + d2h_moved;

    /* One write: both tables and the packed bytes (the d2h table alone when
     * nothing goes to the device). In pieces, the staging is shared: the
     * pack, the pieces' tables and the d2h table are the one transfer. */
    size_t begin = p->h2d_staged ? 0 : p->d2h_table_offset;
    size_t end = p->h2d_staged ? p->h2d_data_offset + h2d_moved : p->d2h_table_offset + p->d2h_staged * ENTRY;
    if (chunks > 1)
        mapping__count_shared_transfer(b->dev, true, (p->h2d_staged + p->d2h_staged) * ENTRY + h2d_moved);
    else if ((st = mapping__batch_stage_out(queue, b, p->host_staging + begin, begin, end - begin)) != MAPPING_OK)
        return st;
    if ((chunks == 1 && (st = move_runs(queue, b, p, true, 0, h2d_runs, h2d, p->h2d_table_offset)) != MAPPING_OK) ||
        (st = move_runs(queue, b, p, false, h2d_runs, p->run_count, d2h, p->d2h_table_offset)) != MAPPING_OK)
        return st;
    if (p->d2h_staged) {
        if ((st = mapping__batch_stage_in(queue, b, p->d2h_data_offset, p->host_staging + p->d2h_data_offset,
                                          d2h_moved)) != MAPPING_OK)
            return st;
        memset(p->done + n_h2d, 1, (n - n_h2d) * sizeof *p->done);
        p->d2h_read = true;
        if (!queue)
            mapping__batch_direct_unpack(p);
    }
    return MAPPING_OK;
}

void mapping__batch_direct_unpack(batch_plan *p)
{
    for (size_t i = 0; i < p->count; i++) {
        const batch_copy *c = &p->copies[i];
        if (!c->to_gpu)
            mapping__copy_small(c->dst, (const unsigned char *)p->host_staging + p->order[i], c->bytes);
    }
}

/* ---- a mirror's ranges: straight from the caller's array ---- */

mapping_status mapping__batch_direct_ranges(mapping_stream *queue, mapping_batch *b, bool to_gpu, void *host,
                                            mapping_buffer *buf, size_t base, const mapping_range *r, size_t n)
{
    mapping_status st = mapping__batch_wait_pending(b); /* the staging may still be read */
    if (st != MAPPING_OK)
        return st;
    size_t bytes = 0, entries = 0;
    for (size_t i = 0; i < n; i++) {
        bytes += r[i].hi - r[i].lo;
        entries += r[i].hi != r[i].lo;
    }
    if (entries == 0)
        return MAPPING_OK;
    size_t data = mapping__align_up(entries * ENTRY, 64);
    if ((st = mapping__batch_ensure_staging(b, data + bytes)) != MAPPING_OK)
        return st;
    char *staging = b->host_staging;
    mapping_scatter_entry *table = (mapping_scatter_entry *)(void *)staging;
    size_t e = 0, at = data;
    for (size_t i = 0; i < n; i++) {
        size_t size = r[i].hi - r[i].lo;
        if (!size)
            continue;
        table[e++] = (mapping_scatter_entry){at, base + r[i].lo, size};
        if (to_gpu)
            mapping__copy_small((unsigned char *)staging + at, (const unsigned char *)host + r[i].lo, size);
        at += size;
    }
    mapping__count(&b->dev->counters.batch_copies, entries);
    batch_plan seen = {.count = entries, .group_count = entries, .staging_bytes = at};
    *(to_gpu ? &seen.h2d_staged : &seen.d2h_staged) = entries;
    seen.moved[to_gpu ? 0 : 1][0] = bytes;
    mapping_trace_span span = mapping__trace_begin();
    if (to_gpu) {
        if ((st = mapping__batch_stage_out(queue, b, staging, 0, at)) == MAPPING_OK)
            st = mapping__scatter(queue, b->dev_staging, 0, table, entries, buf);
    } else {
        if ((st = mapping__batch_stage_out(queue, b, staging, 0, entries * ENTRY)) == MAPPING_OK &&
            (st = mapping__gather(queue, buf, b->dev_staging, 0, table, entries)) == MAPPING_OK)
            st = mapping__batch_stage_in(queue, b, data, staging + data, bytes);
    }
    bool waited = true;
    if (queue)
        st = mapping__batch_wait_queued(b, queue, st, &waited);
    if (st == MAPPING_OK && !to_gpu)
        for (size_t i = 0, k = 0; i < n; i++)
            if (r[i].hi != r[i].lo) {
                mapping__copy_small((unsigned char *)host + r[i].lo,
                                    (const unsigned char *)staging + table[k++].staging_offset, r[i].hi - r[i].lo);
            }
    mapping__batch_flush_done(&span, NULL, b, &seen, st);
    if (st == MAPPING_OK)
        mapping__count(&b->dev->counters.batch_flushes, 1);
    return st;
}
