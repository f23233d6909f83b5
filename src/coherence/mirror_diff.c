/*
 * Device-side diff (MAPPING_MIRROR_DEVICE_DIFF): a sync to the CPU after the
 * device wrote (acquire_gpu with WRITE, mark_gpu_modified) reads back only
 * the blocks whose content changed, found on the device by comparing the
 * buffer with a shadow copy of the content both sides last agreed on.
 *
 * The invariant (absolute family offsets): for every byte in `diff_known`,
 * shadow[byte] == the CPU side's content of that byte, as long as the CPU
 * side is not modified there. It is kept by:
 * - a sync to the CPU: the compared blocks that changed are copied into the
 *   shadow by the kernel; the rest of what the sync reads (bytes not known,
 *   blocks only partly stale) is copied device -> shadow on the same stream;
 *   on success the synced ranges become known, on failure they are forgotten;
 * - a sync to the GPU: once the upload is queued, the uploaded ranges are
 *   copied device -> shadow on the same stream and become known (only while
 *   the diff pays: otherwise they are forgotten, nothing is copied);
 * - a discard on the GPU side (acquire_gpu with WRITE alone drops the CPU's
 *   unsynced modifications, so the CPU no longer equals the shadow): the
 *   range is forgotten (mapping__mirror_diff_forget).
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
#include "coherence/mirror_internal.h"
#include "os/os.h"
#include "os/status.h"

/* Candidates below this many bytes are read, not compared (auto mode). */
enum { DIFF_MIN_BYTES = 64 * 1024 };
/* Diffs at least this large measure the device's compare rate. */
enum { DIFF_MEASURE_BYTES = 1024 * 1024 };

typedef enum { DIFF_AUTO = 0, DIFF_ON = 1, DIFF_OFF = 2, DIFF_BAD = 3 } diff_mode;

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

mapping_status mapping__mirror_diff_begin(const char *fn, mirror_state *st)
{
    if (mode() == DIFF_BAD)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_DEVICE_DIFF=%s is not auto, on or off", fn, getenv("MAPPING_DEVICE_DIFF"));
    st->diff = true;
    st->diff_pays = true;
    mapping__rs_init(&st->diff_known);
    return MAPPING_OK;
}

void mapping__mirror_diff_end(mirror_state *st, bool device_closed)
{
    if (!st->diff)
        return;
    if (!device_closed) {
        mapping__free_gpu(st->diff_shadow);
        mapping__free_gpu(st->diff_flags);
    }
    st->diff_shadow = st->diff_flags = NULL;
    free(st->diff_host_flags);
    st->diff_host_flags = NULL;
    mapping__rs_free(&st->diff_known);
}

mapping_status mapping__mirror_diff_forget(mirror_state *st, size_t lo, size_t hi)
{
    if (!st->diff || !mapping__rs_intersects(&st->diff_known, lo, hi))
        return MAPPING_OK;
    mapping_status status = mapping__rs_remove(&st->diff_known, lo, hi);
    if (status != MAPPING_OK) /* cannot split the set: forget everything (always possible) */
        mapping__rs_free(&st->diff_known);
    return MAPPING_OK;
}

static void forget_list(mirror_state *st, const mapping_range *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        mapping__mirror_diff_forget(st, v[i].lo, v[i].hi);
}

static void know_list(mirror_state *st, const mapping_range *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (mapping__rs_add(&st->diff_known, v[i].lo, v[i].hi) != MAPPING_OK)
            return; /* out of memory: those bytes stay unknown (read in full later) */
}

/* The shadow and the flag buffers, made on first need. */
static mapping_status ensure_buffers(mirror_state *st)
{
    if (st->diff_shadow)
        return MAPPING_OK;
    size_t blocks = (st->size + MAPPING_DIFF_BLOCK - 1) / MAPPING_DIFF_BLOCK;
    mapping_status status;
    if ((status = mapping__allocate_gpu(st->dev, st->size, &st->diff_shadow)) ||
        (status = mapping__allocate_gpu(st->dev, blocks, &st->diff_flags)))
        goto fail;
    if (!(st->diff_host_flags = mapping_os_malloc(blocks))) {
        status = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror diff: out of memory for %zu block flags", blocks);
        goto fail;
    }
    return MAPPING_OK;
fail:
    mapping__free_gpu(st->diff_shadow);
    mapping__free_gpu(st->diff_flags);
    st->diff_shadow = st->diff_flags = NULL;
    return status;
}

/* Device -> shadow copies of the ranges (host offsets), on the stream. */
static mapping_status refresh(mapping_stream *stream, mirror_state *st, const mapping_range *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        mapping_status status =
            mapping__copy(stream, st->gpu, st->gpu_base + v[i].lo, st->diff_shadow, v[i].lo, v[i].hi - v[i].lo);
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

/* Cuts the stale ranges into whole known blocks (candidates) and the rest. */
static bool cut(const mirror_state *st, const mapping_range *exact, size_t n, piece_list *out, size_t *cand_bytes)
{
    *cand_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        size_t lo = exact[i].lo, hi = exact[i].hi, at = lo;
        mapping_rs_cursor c;
        mapping_range k;
        for (bool ok = mapping__rs_seek(&st->diff_known, lo, &c, &k); ok && k.lo < hi; ok = mapping__rs_next(&c, &k)) {
            size_t a = k.lo > lo ? k.lo : lo, b = k.hi < hi ? k.hi : hi;
            if (a >= b)
                continue;
            size_t ba = (a + MAPPING_DIFF_BLOCK - 1) / MAPPING_DIFF_BLOCK * MAPPING_DIFF_BLOCK;
            size_t bb = b / MAPPING_DIFF_BLOCK * MAPPING_DIFF_BLOCK;
            if (bb <= ba) /* no whole block: read it */
                continue;
            if (!push(out, at, ba, false) || !push(out, ba, bb, true))
                return false;
            *cand_bytes += bb - ba;
            at = bb;
        }
        if (!push(out, at, hi, false))
            return false;
    }
    return true;
}

/* Whether to compare cand_bytes now; in auto mode a measured rate that
 * does not beat the link turns the diff off for the family (diff_pays). */
static bool worth_it(mirror_state *st, size_t cand_bytes)
{
    diff_mode m = mode();
    if (m == DIFF_ON)
        return cand_bytes > 0;
    if (cand_bytes < DIFF_MIN_BYTES)
        return false; /* the fixed costs dominate: read it, keep the shadow */
    if (st->diff_rate <= 0)
        return true; /* not measured yet: try once */
    mapping_link link = {0, 0};
    if (mapping__device_link(st->dev, &link) != MAPPING_OK || link.bandwidth <= 0)
        return false;
    double read = (double)cand_bytes / link.bandwidth;
    double diff = (double)cand_bytes / st->diff_rate + 2 * link.latency;
    if (diff >= read)
        st->diff_pays = false;
    return diff < read;
}

mapping_status mapping__mirror_diff_refine(mapping_stream *stream, mirror_state *st, const mapping_range *exact,
                                           size_t n, mapping_range **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    st->diff_used = false;
    /* A diff waits for its stream (the flags come back to the host): from a
     * host function running on that stream it would wait for itself, so
     * such a sync reads in full. */
    bool self_wait = stream && mapping_os_worker_stream() && mapping_os_worker_stream() == stream->state;
    if (mode() == DIFF_OFF || st->unified || !mapping__can_diff(st->dev) || !st->diff_pays || self_wait) {
        forget_list(st, exact, n);
        return MAPPING_OK;
    }
    piece_list pieces = {0};
    size_t cand_bytes = 0;
    mapping_status status = MAPPING_OK;
    mapping_error_mark before;
    mapping__error_mark(&before);
    if (!cut(st, exact, n, &pieces, &cand_bytes)) {
        free(pieces.v);
        forget_list(st, exact, n);
        return MAPPING_OK; /* out of memory for the plan: read it all */
    }
    bool diff_now = cand_bytes > 0 && worth_it(st, cand_bytes);
    if (!st->diff_pays || ensure_buffers(st) != MAPPING_OK) {
        mapping__error_forget(&before); /* the diff is an optimisation: read it all */
        free(pieces.v);
        forget_list(st, exact, n);
        return MAPPING_OK;
    }
    if (!diff_now) {
        for (size_t i = 0; i < pieces.n; i++)
            pieces.v[i].cand = false;
        cand_bytes = 0;
    }
    /* 1. Compare the candidates; the kernel refreshes the shadow of what
     *    changed. The flags come back to the host: this waits for it. */
    uint64_t t0 = mapping_os_now_ns();
    size_t flag_lo = SIZE_MAX, flag_hi = 0;
    for (size_t i = 0; i < pieces.n && status == MAPPING_OK; i++) {
        diff_piece *p = &pieces.v[i];
        if (!p->cand)
            continue;
        status = mapping__diff_blocks(stream, st->gpu, st->gpu_base + p->lo, st->diff_shadow, p->lo, p->hi - p->lo,
                                      st->diff_flags, p->lo / MAPPING_DIFF_BLOCK);
        if (status == MAPPING_ERR_UNSUPPORTED && flag_hi == 0) {
            /* This device has no compare kernel after all (CUDA without its
             * module): nothing was queued; read as a mirror without the flag. */
            mapping__error_forget(&before);
            free(pieces.v);
            forget_list(st, exact, n);
            st->diff_pays = false;
            return MAPPING_OK;
        }
        flag_lo = p->lo / MAPPING_DIFF_BLOCK < flag_lo ? p->lo / MAPPING_DIFF_BLOCK : flag_lo;
        flag_hi = p->hi / MAPPING_DIFF_BLOCK;
    }
    if (status == MAPPING_OK && flag_hi > flag_lo) {
        status = mapping__read(stream, st->diff_flags, flag_lo, st->diff_host_flags + flag_lo, flag_hi - flag_lo);
        if (status == MAPPING_OK && stream)
            status = mapping__stream_synchronize(stream);
        if (status == MAPPING_OK && !stream && cand_bytes >= DIFF_MEASURE_BYTES) {
            double seconds = (double)(mapping_os_now_ns() - t0) * 1e-9;
            if (seconds > 0)
                st->diff_rate = (double)cand_bytes / seconds;
        }
    }
    /* 2. The shadow of what is read whole: device -> shadow, on the stream. */
    for (size_t i = 0; i < pieces.n && status == MAPPING_OK; i++) {
        mapping_range r = {pieces.v[i].lo, pieces.v[i].hi};
        if (!pieces.v[i].cand)
            status = refresh(stream, st, &r, 1);
    }
    /* 3. What to read: the pieces read whole, and the changed blocks. */
    mapping_range *list = status == MAPPING_OK ? mapping_os_malloc((pieces.n + (cand_bytes / MAPPING_DIFF_BLOCK)) * sizeof *list)
                                               : NULL;
    if (status == MAPPING_OK && !list)
        status = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror diff: out of memory");
    size_t k = 0;
    for (size_t i = 0; status == MAPPING_OK && i < pieces.n; i++) {
        diff_piece *p = &pieces.v[i];
        for (size_t at = p->lo; at < p->hi; at = p->cand ? at + MAPPING_DIFF_BLOCK : p->hi) {
            size_t lo = at, hi = p->cand ? at + MAPPING_DIFF_BLOCK : p->hi;
            if (p->cand && !st->diff_host_flags[at / MAPPING_DIFF_BLOCK])
                continue;
            if (k && list[k - 1].hi == lo)
                list[k - 1].hi = hi;
            else
                list[k++] = (mapping_range){lo, hi};
        }
    }
    free(pieces.v);
    if (status != MAPPING_OK) {
        free(list);
        forget_list(st, exact, n); /* the kernel may have refreshed blocks the CPU never got */
        return status;
    }
    st->diff_used = true;
    *out = list;
    *n_out = k;
    return MAPPING_OK;
}

void mapping__mirror_diff_synced(mapping_stream *stream, mirror_state *st, int t, const mapping_range *exact,
                                 size_t n_exact, const mapping_range *copied, size_t n_copied, mapping_status status)
{
    if (t == MIRROR_CPU) {
        if (status == MAPPING_OK && st->diff_used)
            know_list(st, exact, n_exact);
        else
            forget_list(st, exact, n_exact);
        st->diff_used = false;
        return;
    }
    /* To the GPU: the device now holds the CPU's bytes there. */
    forget_list(st, exact, n_exact);
    if (status != MAPPING_OK || mode() == DIFF_OFF || st->unified || !mapping__can_diff(st->dev) || !st->diff_pays)
        return;
    mapping_error_mark before;
    mapping__error_mark(&before);
    if (ensure_buffers(st) != MAPPING_OK || refresh(stream, st, copied, n_copied) != MAPPING_OK) {
        mapping__error_forget(&before); /* stays unknown: read in full later */
        return;
    }
    know_list(st, copied, n_copied);
}
