/*
 * Copies through mapped device memory. Where the device's memory is the
 * CPU's (PoCL's CPU device; the host back end without a modelled link:
 * mapping__can_map), a blocking flush of small copies in order, and a
 * mirror's ranges, need no staging, no table and no scatter: each run of
 * copies of one direction and buffer maps the span they cover (the buffer's
 * own memory: PoCL maps 256 MiB in ~8 us), the CPU copies them in add
 * order (so of two overlapping copies the later one wins) and the span is
 * unmapped. A pack into staging, a table and a kernel that reads both cost
 * more than the copies themselves (on PoCL the staging's lines were last
 * held by the device's thread on the other core).
 *
 * Counted as one transfer per direction, as the one-pass flush is.
 *
 * Failure: a run whose map fails is not done, nor is any run after it.
 * Once mapped, the copies are made in the buffer's own memory, so a run
 * whose unmap fails is done (and the failure reported); the unmap is tried
 * once more, so that the mapping is not left open (the driver would keep
 * the buffer's memory past its release).
 */
#include "core/ops.h"
#include "transfer/transfer.h"
#include "transfer/transfer_observe.h"

/* One run: copies of one direction and buffer, through one mapping of
 * the buffer's [lo, hi). */
typedef struct mapped_run {
    mapping_buffer *buf;
    bool            to_gpu;
    size_t          lo, hi;
} mapped_run;

/* *at: the CPU address of the buffer's byte run->lo. */
static mapping_status map_run(const mapped_run *run, unsigned char **at)
{
    void *host = NULL;
    mapping_status st = mapping__map(run->buf, run->lo, run->hi - run->lo, &host);
    *at = host;
    return st;
}

/* Ends the mapping at `at`; on failure tries once more (the first failure
 * is the one reported). */
static mapping_status unmap_run(const mapped_run *run, unsigned char *at)
{
    mapping_status st = mapping__unmap(run->buf, at);
    if (st != MAPPING_OK) {
        mapping_error_mark first;
        mapping__error_mark(&first);
        mapping__unmap(run->buf, at);
        mapping__error_forget(&first); /* the first failure stays the one recorded */
    }
    return st;
}

/* ---- a batch's copies (the one-pass flush's plan: sorted, all small) ---- */

/* The end of the run starting at copies[i] (same direction and buffer),
 * and the span it covers. */
static size_t run_end(const batch_plan *p, size_t i, mapped_run *run)
{
    const batch_copy *c = &p->copies[i];
    *run = (mapped_run){c->buf, c->to_gpu, c->offset, c->offset + c->bytes};
    size_t j = i + 1;
    for (; j < p->count && p->copies[j].buf == c->buf && p->copies[j].to_gpu == c->to_gpu; j++)
        if (p->copies[j].offset + p->copies[j].bytes > run->hi)
            run->hi = p->copies[j].offset + p->copies[j].bytes;
    return j;
}

mapping_status mapping__batch_mapped_run(mapping_batch *b, batch_plan *p)
{
    mapping_status st = MAPPING_OK;
    size_t moved[2] = {0, 0}, copies[2] = {0, 0};
    for (size_t i = 0, end; i < p->count && st == MAPPING_OK; i = end) {
        mapped_run run;
        end = run_end(p, i, &run);
        unsigned char *at;
        if ((st = map_run(&run, &at)) != MAPPING_OK)
            break;
        for (size_t k = i; k < end; k++) {
            const batch_copy *c = &p->copies[k];
            if (c->to_gpu)
                mapping__copy_small(at + (c->offset - run.lo), c->src, c->bytes);
            else
                mapping__copy_small(c->dst, at + (c->offset - run.lo), c->bytes);
            moved[c->to_gpu ? 0 : 1] += c->bytes;
        }
        copies[run.to_gpu ? 0 : 1] += end - i;
        memset(p->done + i, 1, (end - i) * sizeof *p->done);
        st = unmap_run(&run, at);
    }
    for (int d = 0; d < 2; d++)
        if (moved[d])
            mapping__count_shared_transfer(b->dev, d == 0, moved[d]);
    /* For the trace: every copy its own group, nothing staged. */
    p->group_count = copies[0] + copies[1];
    p->h2d_groups = p->h2d_staged = copies[0];
    p->d2h_staged = copies[1];
    p->moved[0][0] = moved[0];
    p->moved[1][0] = moved[1];
    p->staging_bytes = 0;
    return st;
}

/* ---- a mirror's ranges (sorted, disjoint) ---- */

mapping_status mapping__batch_mapped_ranges(mapping_batch *b, bool to_gpu, void *host, mapping_buffer *buf,
                                            size_t base, const mapping_range *r, size_t n)
{
    size_t first = 0, last = n;
    while (first < n && r[first].hi == r[first].lo)
        first++;
    while (last > first && r[last - 1].hi == r[last - 1].lo)
        last--;
    if (first == last)
        return MAPPING_OK;
    mapped_run run = {buf, to_gpu, base + r[first].lo, base + r[last - 1].hi};
    unsigned char *at; /* the buffer's byte run.lo = base + r[first].lo */
    mapping_trace_span span = mapping__trace_begin();
    mapping_status st = map_run(&run, &at);
    size_t bytes = 0, entries = 0;
    if (st == MAPPING_OK) {
        const unsigned char *lo = (const unsigned char *)host + r[first].lo;
        for (size_t i = first; i < last; i++) {
            size_t size = r[i].hi - r[i].lo, from = r[i].lo - r[first].lo;
            if (!size)
                continue;
            if (to_gpu)
                mapping__copy_small(at + from, lo + from, size);
            else
                mapping__copy_small((unsigned char *)host + r[i].lo, at + from, size);
            bytes += size;
            entries++;
        }
        st = unmap_run(&run, at);
        mapping__count(&b->dev->counters.batch_copies, entries);
        mapping__count_shared_transfer(b->dev, to_gpu, bytes);
    }
    batch_plan seen = {.count = entries, .group_count = entries};
    *(to_gpu ? &seen.h2d_staged : &seen.d2h_staged) = entries;
    seen.moved[to_gpu ? 0 : 1][0] = bytes;
    mapping__batch_flush_done(&span, NULL, b, &seen, st);
    if (st == MAPPING_OK)
        mapping__count(&b->dev->counters.batch_flushes, 1);
    return st;
}
