/*
 * Copies through mapped device memory. Where the device's memory is the
 * CPU's (PoCL's CPU device; the host back end without a modelled link:
 * mapping__can_map), a blocking flush and a mirror's ranges need no
 * staging, no table and no scatter: each buffer's span is mapped once (the
 * buffer's own memory: PoCL maps 256 MiB in ~8 us), the CPU copies, and the
 * spans are unmapped. A pack into staging, a table and a kernel that reads
 * both cost more than the copies themselves (on PoCL the staging's lines
 * were last held by the device's thread on the other core).
 *
 * A batch's copies are made in add order, the host-to-device ones first,
 * which is the contract's order itself: no sort, no groups, and of two
 * overlapping copies the later one wins. Copies added in any order cost the
 * same, and so do large ones (a memcpy, as the driver's write is on a CPU
 * device).
 *
 * Counted as one transfer per direction, as the one-pass flush is.
 *
 * Failure: when a map fails, nothing is done (the spans already mapped are
 * unmapped). Once mapped, the copies are made in the buffers' own memory, so
 * they are done even if an unmap fails. A failed unmap is tried once more
 * (a mapping left open keeps the buffer's memory in the driver); only when
 * that fails too is the flush's status the failure.
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

/* Ends the mapping at `at`. A failed unmap is tried once more: a mapping
 * left open keeps the buffer's memory in the driver past its release. When
 * the second try succeeds, nothing failed (the first failure is forgotten);
 * otherwise the first failure is the one reported. */
static mapping_status unmap_run(const mapped_run *run, unsigned char *at)
{
    mapping_error_mark before, first;
    mapping__error_mark(&before);
    if (mapping__unmap(run->buf, at) == MAPPING_OK)
        return MAPPING_OK;
    mapping__error_mark(&first);
    if (mapping__unmap(run->buf, at) == MAPPING_OK) {
        mapping__error_forget(&before);
        return MAPPING_OK;
    }
    mapping__error_forget(&first);
    return first.status;
}

/* What a mapped flush moved: one transfer per direction in the counters,
 * and for the trace every copy its own group, nothing staged. */
static void mapped_done(mapping_batch *b, batch_plan *p, const size_t moved[2], const size_t copies[2])
{
    for (int d = 0; d < 2; d++)
        if (moved[d])
            mapping__count_shared_transfer(b->dev, d == 0, moved[d]);
    p->group_count = copies[0] + copies[1];
    p->h2d_groups = p->h2d_staged = copies[0];
    p->d2h_staged = copies[1];
    p->moved[0][0] = moved[0];
    p->moved[1][0] = moved[1];
    p->staging_bytes = 0;
}

/* ---- a batch's copies in plan order (the one-pass flush's: sorted, all small) ---- */

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

mapping_status mapping__batch_mapped_runs(mapping_batch *b, batch_plan *p)
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
    mapped_done(b, p, moved, copies);
    return st;
}

/* ---- a batch's copies in any order, in add order ---- */

/* The spans of the buffers a flush touches: at most MAPPED_MAX_BUFFERS, each
 * mapped once for both directions. */
enum { MAPPED_MAX_BUFFERS = 16 };
typedef struct mapped_spans {
    mapped_run     run[MAPPED_MAX_BUFFERS]; /* to_gpu unused: a span serves both directions */
    unsigned char *at[MAPPED_MAX_BUFFERS];
    int            count;
} mapped_spans;

/* The span of c's buffer, widened to take c; -1 when there would be too many. */
static int span_of(mapped_spans *s, const batch_copy *c, int last)
{
    int k = last;
    if (k < 0 || s->run[k].buf != c->buf) {
        for (k = 0; k < s->count && s->run[k].buf != c->buf; k++)
            ;
        if (k == s->count) {
            if (k == MAPPED_MAX_BUFFERS)
                return -1;
            s->run[s->count++] = (mapped_run){c->buf, false, c->offset, c->offset + c->bytes};
        }
    }
    mapped_run *r = &s->run[k];
    r->lo = c->offset < r->lo ? c->offset : r->lo;
    r->hi = c->offset + c->bytes > r->hi ? c->offset + c->bytes : r->hi;
    return k;
}

bool mapping__batch_mapped_fits(const mapping_batch *b)
{
    mapped_spans s = {.count = 0};
    int last = -1;
    for (size_t i = 0; i < b->count; i++)
        if ((last = span_of(&s, &b->copies[i], last)) < 0)
            return false;
    return true;
}

mapping_status mapping__batch_mapped_any(mapping_batch *b, batch_plan *p)
{
    mapped_spans s = {.count = 0};
    size_t *span = p->group_of; /* each copy's span: its group here */
    int last = -1;
    for (size_t i = 0; i < p->count; i++) /* at most MAPPED_MAX_BUFFERS: mapping__batch_mapped_fits said so */
        span[i] = (size_t)(last = span_of(&s, &p->copies[i], last));
    mapping_status st = MAPPING_OK;
    for (int k = 0; k < s.count; k++)
        if ((st = map_run(&s.run[k], &s.at[k])) != MAPPING_OK) {
            while (k-- > 0)
                unmap_run(&s.run[k], s.at[k]);
            return st; /* nothing done */
        }
    size_t moved[2] = {0, 0}, copies[2] = {0, 0};
    for (int pass = 0; pass < 2; pass++) /* host to device first */
        for (size_t i = 0; i < p->count; i++) {
            const batch_copy *c = &p->copies[i];
            if (c->to_gpu != (pass == 0))
                continue;
            unsigned char *at = s.at[span[i]] + (c->offset - s.run[span[i]].lo);
            if (c->to_gpu)
                mapping__copy_small(at, c->src, c->bytes);
            else
                mapping__copy_small(c->dst, at, c->bytes);
            moved[pass] += c->bytes;
            copies[pass]++;
        }
    memset(p->done, 1, p->count * sizeof *p->done);
    for (int k = 0; k < s.count; k++) {
        mapping_status u = unmap_run(&s.run[k], s.at[k]);
        st = st != MAPPING_OK ? st : u;
    }
    mapped_done(b, p, moved, copies);
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
