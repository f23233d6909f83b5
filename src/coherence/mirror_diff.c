/*
 * Device-side diff (MAPPING_MIRROR_DEVICE_DIFF, a feature: mirror_features.h):
 * a sync to the CPU after the device wrote (acquire_gpu with WRITE,
 * mark_gpu_modified) reads back only the blocks whose content changed, found
 * on the device by comparing the buffer with a shadow copy of the content
 * both sides last agreed on.
 *
 * The invariant (absolute family offsets): for every byte in `known`,
 * shadow[byte] == the CPU side's content of that byte, as long as the CPU
 * side is not modified there. It is kept by:
 * - a sync to the CPU (refine, copied): the compared blocks that changed are
 *   copied into the shadow by the kernel; the rest of what the sync reads
 *   (bytes not known, blocks only partly stale) is copied device -> shadow
 *   on the same stream; on success the synced ranges become known, on
 *   failure they are forgotten;
 * - a sync to the GPU (copied): once the upload is queued, the uploaded
 *   ranges are copied device -> shadow on the same stream and become known
 *   (only while the diff pays: otherwise they are forgotten);
 * - cpu_diverged: the CPU's content changed without a CPU mark (a discard
 *   on the GPU side dropped the CPU's unsynced writes; a tracked write hit
 *   bytes stale on the CPU): the range is forgotten.
 * A CPU modification needs nothing: it makes the GPU side stale, so the
 * device cannot be marked modified there without first syncing (which
 * refreshes the shadow) or discarding (which forgets).
 * Anything unknown is read in full: the diff never decides from stale facts.
 *
 * Whether it pays: a blocking diff measures how fast the device compared
 * (bytes per second); a sync then diffs when comparing the candidate bytes
 * is estimated to cost less than reading them over the link
 * (mapping_device_link). $MAPPING_DEVICE_DIFF = auto (that choice), on
 * (always), off (never: the flag changes nothing).
 */
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_features.h"
#include "coherence/mirror_plan.h"
#include "os/os.h"
#include "os/status.h"

/* Candidates below this many bytes are read, not compared (auto mode). */
enum { DIFF_MIN_BYTES = 64 * 1024 };
/* Diffs at least this large measure the device's compare rate. */
enum { DIFF_MEASURE_BYTES = 1024 * 1024 };

typedef enum { DIFF_AUTO = 0, DIFF_ON = 1, DIFF_OFF = 2, DIFF_BAD = 3 } diff_mode;

struct mirror_diff {
    bool              pays; /* auto: comparing beat the link so far */
    bool              used; /* the current sync to the CPU compared */
    mapping_buffer   *shadow, *flags;
    unsigned char    *host_flags;
    mapping_range_set known;
    double            rate; /* bytes per second the device compared; 0: not measured */
};

static _Atomic int cached = -1;

void mapping__mirror_diff_force_mode(int m)
{
    cached = m;
}

static diff_mode mode(void)
{
    int m = cached;
    if (m < 0) {
        const char *v = getenv("MAPPING_DEVICE_DIFF");
        m = !v || !*v || strcmp(v, "auto") == 0 ? DIFF_AUTO
            : strcmp(v, "on") == 0              ? DIFF_ON
            : strcmp(v, "off") == 0             ? DIFF_OFF
                                                : DIFF_BAD;
        cached = m;
    }
    return (diff_mode)m;
}

size_t mapping__mirror_diff_known_bytes(const mirror_state *st)
{
    return st->diff ? mapping__rs_bytes_in(&st->diff->known, 0, st->size) : 0;
}

static void diff_forget(mirror_state *st, size_t lo, size_t hi)
{
    mapping_range_set *known = &st->diff->known;
    if (mapping__rs_intersects(known, lo, hi) && mapping__rs_remove(known, lo, hi) != MAPPING_OK)
        mapping__rs_free(known); /* cannot split the set: forget everything (always possible) */
}

static void forget_list(mirror_state *st, const mapping_range *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        diff_forget(st, v[i].lo, v[i].hi);
}

static void know_list(mirror_state *st, const mapping_range *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (mapping__rs_add(&st->diff->known, v[i].lo, v[i].hi) != MAPPING_OK)
            return; /* out of memory: those bytes stay unknown (read in full later) */
}

/* The shadow and the flag buffers, made on first need. */
static mapping_status ensure_buffers(mirror_state *st)
{
    struct mirror_diff *d = st->diff;
    if (d->shadow)
        return MAPPING_OK;
    size_t blocks = (st->size + MAPPING_DIFF_BLOCK - 1) / MAPPING_DIFF_BLOCK;
    mapping_status status;
    if ((status = mapping__allocate_gpu_counted("mirror diff (shadow)", st->dev, st->size, &d->shadow)) ||
        (status = mapping__allocate_gpu_counted("mirror diff (flags)", st->dev, blocks, &d->flags)))
        goto fail;
    if (!(d->host_flags = mapping_os_malloc(blocks))) {
        status = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror diff: out of memory for %zu block flags", blocks);
        goto fail;
    }
    return MAPPING_OK;
fail:
    mapping__free_gpu(d->shadow);
    mapping__free_gpu(d->flags);
    d->shadow = d->flags = NULL;
    return status;
}

/* Device -> shadow copies of the ranges (host offsets), on the stream. */
static mapping_status refresh(mapping_stream *stream, mirror_state *st, const mapping_range *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        mapping_status status =
            mapping__copy(stream, st->gpu, st->gpu_base + v[i].lo, st->diff->shadow, v[i].lo, v[i].hi - v[i].lo);
        if (status != MAPPING_OK)
            return status;
    }
    return MAPPING_OK;
}

/* A piece of a stale range: compared block by block (cand) or read whole. */
typedef struct diff_piece {
    size_t lo, hi;
    bool   cand;
} diff_piece;

typedef struct piece_list {
    diff_piece *v;
    size_t      n, cap;
    size_t      cand_bytes;
} piece_list;

static bool push(piece_list *l, size_t lo, size_t hi, bool cand)
{
    if (lo >= hi)
        return true;
    if (l->n && l->v[l->n - 1].hi == lo && l->v[l->n - 1].cand == cand) {
        l->v[l->n - 1].hi = hi;
        return true;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        diff_piece *v = mapping_os_realloc(l->v, cap * sizeof *v);
        if (!v)
            return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (diff_piece){lo, hi, cand};
    return true;
}

/* Cuts stale range [lo, hi) into whole known blocks (candidates) and the rest. */
static bool cut_one(const mirror_state *st, size_t lo, size_t hi, piece_list *out)
{
    size_t at = lo;
    mapping_rs_cursor c;
    mapping_range k;
    for (bool ok = mapping__rs_seek(&st->diff->known, lo, &c, &k); ok && k.lo < hi; ok = mapping__rs_next(&c, &k)) {
        size_t a = k.lo > lo ? k.lo : lo, b = k.hi < hi ? k.hi : hi;
        size_t ba = (a + MAPPING_DIFF_BLOCK - 1) / MAPPING_DIFF_BLOCK * MAPPING_DIFF_BLOCK;
        size_t bb = b / MAPPING_DIFF_BLOCK * MAPPING_DIFF_BLOCK;
        if (a >= b || bb <= ba) /* no whole block: read it */
            continue;
        if (!push(out, at, ba, false) || !push(out, ba, bb, true))
            return false;
        out->cand_bytes += bb - ba;
        at = bb;
    }
    return push(out, at, hi, false);
}

static bool cut(const mirror_state *st, const mapping_range *exact, size_t n, piece_list *out)
{
    for (size_t i = 0; i < n; i++)
        if (!cut_one(st, exact[i].lo, exact[i].hi, out))
            return false;
    return true;
}

/* Whether to compare cand_bytes now; in auto mode a measured rate that
 * does not beat the link turns the diff off for the family (pays). */
static bool worth_it(mirror_state *st, size_t cand_bytes)
{
    struct mirror_diff *d = st->diff;
    diff_mode m = mode();
    if (m == DIFF_ON)
        return cand_bytes > 0;
    if (cand_bytes < DIFF_MIN_BYTES)
        return false; /* the fixed costs dominate: read it, keep the shadow */
    if (d->rate <= 0)
        return true; /* not measured yet: try once */
    mapping_link link = {0, 0};
    if (mapping__device_link(st->dev, &link) != MAPPING_OK || link.bandwidth <= 0)
        return false;
    double read = (double)cand_bytes / link.bandwidth;
    double diff = (double)cand_bytes / d->rate + 2 * link.latency;
    if (diff >= read)
        d->pays = false;
    return diff < read;
}

/* Whether a sync to the CPU may diff at all. A diff waits for its stream
 * (the flags come back to the host): from a host function running on that
 * stream it would wait for itself, so such a sync reads in full. */
static bool diff_possible(mapping_stream *stream, const mirror_state *st)
{
    bool self_wait = stream && mapping_os_worker_stream() && mapping_os_worker_stream() == stream->state;
    return mode() != DIFF_OFF && !st->unified && mapping__can_diff(st->dev) && st->diff->pays && !self_wait;
}

/* 1. Compares the candidate pieces; the kernel refreshes the shadow of what
 *    changed. The flags come back to the host: this waits for the stream.
 *    MAPPING_ERR_UNSUPPORTED (nothing queued): the device has no kernel. */
static mapping_status compare(mapping_stream *stream, mirror_state *st, const piece_list *pieces)
{
    struct mirror_diff *d = st->diff;
    uint64_t t0 = mapping_os_now_ns();
    size_t flag_lo = SIZE_MAX, flag_hi = 0;
    mapping_status status = MAPPING_OK;
    for (size_t i = 0; i < pieces->n && status == MAPPING_OK; i++) {
        const diff_piece *p = &pieces->v[i];
        if (!p->cand)
            continue;
        status = mapping__diff_blocks(stream, st->gpu, st->gpu_base + p->lo, d->shadow, p->lo, p->hi - p->lo, d->flags,
                                      p->lo / MAPPING_DIFF_BLOCK);
        if (status == MAPPING_ERR_UNSUPPORTED && flag_hi == 0)
            return status;
        flag_lo = p->lo / MAPPING_DIFF_BLOCK < flag_lo ? p->lo / MAPPING_DIFF_BLOCK : flag_lo;
        flag_hi = p->hi / MAPPING_DIFF_BLOCK;
    }
    if (status != MAPPING_OK || flag_hi <= flag_lo)
        return status;
    status = mapping__read(stream, d->flags, flag_lo, d->host_flags + flag_lo, flag_hi - flag_lo);
    if (status == MAPPING_OK && stream)
        status = mapping__stream_synchronize(stream);
    if (status == MAPPING_OK && !stream && pieces->cand_bytes >= DIFF_MEASURE_BYTES) {
        double seconds = (double)(mapping_os_now_ns() - t0) * 1e-9;
        if (seconds > 0)
            d->rate = (double)pieces->cand_bytes / seconds;
    }
    return status;
}

/* 3. What to read: the pieces read whole, and the changed blocks; NULL
 *    when out of memory. */
static mapping_range *changed_list(const mirror_state *st, const piece_list *pieces, size_t *n_out)
{
    mapping_range *list = mapping_os_malloc((pieces->n + pieces->cand_bytes / MAPPING_DIFF_BLOCK) * sizeof *list);
    size_t k = 0;
    for (size_t i = 0; list && i < pieces->n; i++) {
        const diff_piece *p = &pieces->v[i];
        for (size_t at = p->lo; at < p->hi; at = p->cand ? at + MAPPING_DIFF_BLOCK : p->hi) {
            size_t lo = at, hi = p->cand ? at + MAPPING_DIFF_BLOCK : p->hi;
            if (p->cand && !st->diff->host_flags[at / MAPPING_DIFF_BLOCK])
                continue;
            if (k && list[k - 1].hi == lo)
                list[k - 1].hi = hi;
            else
                list[k++] = (mapping_range){lo, hi};
        }
    }
    *n_out = k;
    return list;
}

/* Compares, refreshes what is read whole, and lists what to read. */
static mapping_status diff_pieces(mapping_stream *stream, mirror_state *st, piece_list *pieces, sync_plan *p)
{
    mapping_status status = compare(stream, st, pieces);
    if (status == MAPPING_ERR_UNSUPPORTED) /* CUDA without its module: read as a mirror without the flag */
        return status;
    /* 2. The shadow of what is read whole: device -> shadow, on the stream. */
    for (size_t i = 0; i < pieces->n && status == MAPPING_OK; i++) {
        mapping_range r = {pieces->v[i].lo, pieces->v[i].hi};
        if (!pieces->v[i].cand)
            status = refresh(stream, st, &r, 1);
    }
    size_t n = 0;
    mapping_range *list = status == MAPPING_OK ? changed_list(st, pieces, &n) : NULL;
    if (status == MAPPING_OK && !list)
        status = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror diff: out of memory");
    if (status != MAPPING_OK) {
        forget_list(st, p->exact, p->n_exact); /* the kernel may have refreshed blocks the CPU never got */
        return status;
    }
    st->diff->used = true;
    mapping__mirror_plan_refine(st, p, list, n);
    return MAPPING_OK;
}

/* A sync to the CPU of the exact stale ranges: what to read instead, the
 * changed blocks and what the shadow does not know (p->merged); unchanged
 * when reading everything is the better plan. */
static mapping_status diff_refine(mapping_stream *stream, mirror_state *st, sync_plan *p)
{
    st->diff->used = false;
    if (p->target != MIRROR_CPU)
        return MAPPING_OK;
    piece_list pieces = {0};
    mapping_error_mark before;
    mapping__error_mark(&before);
    mapping_status status = MAPPING_OK;
    /* The diff is an optimisation: out of memory for the plan or the
     * shadow, or a device without the kernel, reads it all. */
    if (!diff_possible(stream, st) || !cut(st, p->exact, p->n_exact, &pieces)) {
        forget_list(st, p->exact, p->n_exact);
    } else {
        bool diff_now = pieces.cand_bytes > 0 && worth_it(st, pieces.cand_bytes);
        if (!st->diff->pays || ensure_buffers(st) != MAPPING_OK) {
            forget_list(st, p->exact, p->n_exact);
        } else {
            for (size_t i = 0; i < pieces.n && !diff_now; i++)
                pieces.v[i].cand = false;
            pieces.cand_bytes = diff_now ? pieces.cand_bytes : 0;
            if ((status = diff_pieces(stream, st, &pieces, p)) == MAPPING_ERR_UNSUPPORTED) {
                forget_list(st, p->exact, p->n_exact);
                st->diff->pays = false;
                status = MAPPING_OK;
            }
        }
    }
    if (status == MAPPING_OK)
        mapping__error_forget(&before);
    free(pieces.v);
    return status;
}

/* After the copies of a sync were done or queued (status). */
static mapping_status diff_copied(mapping_stream *stream, mirror_state *st, const sync_plan *p, mapping_status status)
{
    struct mirror_diff *d = st->diff;
    if (p->target == MIRROR_CPU) {
        if (status == MAPPING_OK && d->used)
            know_list(st, p->exact, p->n_exact);
        else
            forget_list(st, p->exact, p->n_exact);
        d->used = false;
        return MAPPING_OK;
    }
    /* To the GPU: the device now holds the CPU's bytes there. */
    forget_list(st, p->exact, p->n_exact);
    if (status != MAPPING_OK || mode() == DIFF_OFF || st->unified || !mapping__can_diff(st->dev) || !d->pays)
        return MAPPING_OK;
    mapping_error_mark before;
    mapping__error_mark(&before);
    if (ensure_buffers(st) != MAPPING_OK || refresh(stream, st, p->merged, p->n_merged) != MAPPING_OK) {
        mapping__error_forget(&before); /* stays unknown: read in full later */
        return MAPPING_OK;
    }
    know_list(st, p->merged, p->n_merged);
    return MAPPING_OK;
}

static void diff_cpu_diverged(mirror_state *st, size_t lo, size_t hi)
{
    diff_forget(st, lo, hi);
}

/* The device side is evicted: the shadow goes with it, and nothing is
 * known (the next upload refreshes it). */
static void diff_evicted(mirror_state *st)
{
    struct mirror_diff *d = st->diff;
    mapping__free_gpu(d->shadow);
    mapping__free_gpu(d->flags);
    d->shadow = d->flags = NULL;
    free(d->host_flags);
    d->host_flags = NULL;
    mapping__rs_free(&d->known);
}

/* Frees the shadow (not when the device was closed: it took the buffers). */
static void diff_end(mirror_state *st, bool device_closed)
{
    struct mirror_diff *d = st->diff;
    if (!device_closed) {
        mapping__free_gpu(d->shadow);
        mapping__free_gpu(d->flags);
    }
    free(d->host_flags);
    mapping__rs_free(&d->known);
    free(d);
    st->diff = NULL;
}

static const mirror_feature diff_feature = {
    .name = "device diff",
    .stages = MIRROR_STAGES_TO_CPU | MIRROR_STAGES_TO_GPU,
    .cpu_diverged = diff_cpu_diverged,
    .refine = diff_refine,
    .copied = diff_copied,
    .evicted = diff_evicted,
    .end = diff_end,
};

mapping_status mapping__mirror_diff_begin(const char *fn, mirror_state *st)
{
    if (mode() == DIFF_BAD)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_DEVICE_DIFF=%s is not auto, on or off", fn, getenv("MAPPING_DEVICE_DIFF"));
    struct mirror_diff *d = mapping_os_calloc(1, sizeof *d);
    if (!d)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    d->pays = true;
    mapping__rs_init(&d->known);
    st->diff = d;
    mapping__mirror_add_feature(st, &diff_feature);
    return MAPPING_OK;
}
