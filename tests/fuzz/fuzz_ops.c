/*
 * The fuzz decoder: bytes -> operations -> checks against a byte model
 * (fuzz_ops.h). Public API only.
 *
 * Input layout: a header (which device object: on the host back end one
 * with a modelled slow link; the mirror's size; how the mirror is made; the
 * link the library plans with), then operations, each an opcode byte and its
 * parameter bytes, until the input ends or MAX_OPS have run. Every byte
 * string is a valid input; parameters past the end read as 0.
 *
 * Three worlds share the device and its two streams:
 * - the tracked world (op_tracked_round): a mirror made with
 *   MAPPING_MIRROR_TRACK_WRITES that the decoder never marks. Rounds of CPU
 *   writes (stores, memset, memcpy, read(2) from a pipe where the mechanism
 *   lets the kernel write) and device writes inside acquire_gpu, with syncs
 *   of views on streams; the model is the bytes alone, checked after each
 *   whole sync (page granularity decides what moves, not what must arrive).
 * - the mirror world: one mirror family (root + up to MAX_VIEWS views). The
 *   model is the library's rules on plain arrays (value, stale and modified
 *   per byte and side). The library orders its own queued copies; the
 *   decoder only synchronizes the streams before it writes the mirror's
 *   memory directly (host writes, fill/copy on the device buffer), as the
 *   header asks of any caller.
 * - the buffer world: NBUF device buffers, a host source array and a host
 *   destination array, one batch, a pipeline, direct copies/fills on streams. The model
 *   holds every byte of the buffers (filled at the start) and of the
 *   destination array (with a "known" flag: overlapping device-to-host
 *   destinations of one flush are unspecified). The library does not order
 *   work of two streams, so the decoder does, as a correct caller would: work
 *   on a stream after work on the other is joined by an event, and blocking
 *   work or host access first waits for the streams.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mapping.h"
#include "fuzz_ops.h"

enum {
    MAX_OPS = 160,
    MAX_VIEWS = 4,
    MIRROR_MAX = 8192,
    NBUF = 2,
    BUF_BYTES = 96 << 10, /* above the batch's smallest straight-through size (64 KiB) */
    LARGE_MIN = 64 << 10,
    MAX_QUEUED = 256,
    TRACE_LINES = 48,
    TRACK_MAX = 16 * 4096 + 100
};

/* ---- the device and what lives across inputs ---- */

/* One device object and what the decoder keeps on it. On the host back end
 * the second one models a slow link (20 us + 4 GB/s per copy), so queued
 * work is still running when later operations come; the input's first byte
 * picks the device. */
typedef struct fuzz_device {
    mapping_device *dev;
    mapping_stream *streams[2];
    mapping_buffer *bufs[NBUF], *scratch; /* scratch: known content, a copy_gpu source */
} fuzz_device;

static fuzz_device devices[2];
static int         n_devices;
static fuzz_device *D; /* the input's */
static unsigned char   scratch_host[MIRROR_MAX];
static atomic_uint     host_fn_runs;
static unsigned long long total_ops, total_bytes_checked, total_tracked_rounds;

/* ---- one input's state ---- */

typedef struct queued {
    int    to_gpu, buf;
    size_t dev_off, host_off, bytes;
} queued;

typedef struct fuzz {
    const uint8_t *data;
    size_t         size, pos;
    int            op_index;
    char           trace[TRACE_LINES][96];
    int            trace_n;
    int            verbose;

    /* mirror world */
    mapping_mirror *handles[1 + MAX_VIEWS]; /* [0] the root, NULL once destroyed */
    int             nviews;                 /* views in handles[1..] */
    unsigned char  *root_cpu;
    mapping_buffer *root_gpu;
    void           *wrapped; /* the caller's memory of a wrapped mirror */
    size_t          msize;
    unsigned char   value[MIRROR_MAX];
    unsigned char   stale[2][MIRROR_MAX]; /* [0] CPU, [1] GPU */
    unsigned char   mod[2][MIRROR_MAX];

    /* tracked world (op_tracked_round): a write-tracking mirror, never marked */
    mapping_mirror *tracked;
    size_t          tsize;
    unsigned char   tvalue[TRACK_MAX];

    /* buffer world */
    mapping_batch *batch;
    mapping_pipeline *pipe; /* made by the first pipeline operation */
    queued         q[MAX_QUEUED];
    size_t         nq;
    int            busy[2]; /* buffer-world work on the stream not yet waited for or joined */
    unsigned char  hs[BUF_BYTES];           /* host sources (the real memory) */
    unsigned char  hd[BUF_BYTES];           /* host destinations (the real memory) */
    unsigned char  hd_model[BUF_BYTES], hd_known[BUF_BYTES];
    unsigned char  dv[NBUF][BUF_BYTES];     /* the device buffers (filled at the start) */
    unsigned       hd_stamp[BUF_BYTES]; /* the last flush that wrote each host destination byte */
    unsigned       hd_dup[BUF_BYTES];   /* the last flush that wrote it twice */
    unsigned       flush_id;
    unsigned       host_fns;            /* launched; host_fn_runs must reach it */
    unsigned       runs_at_start;
    unsigned char  readback[BUF_BYTES];
    unsigned long long rng;
} fuzz;

static fuzz F; /* large: one per process, reset per input */

/* ---- input ---- */

static unsigned u8(fuzz *f)
{
    return f->pos < f->size ? f->data[f->pos++] : 0;
}

static unsigned u16(fuzz *f)
{
    unsigned lo = u8(f);
    return lo | u8(f) << 8;
}

/* Bytes written by the decoder: a generator seeded by the input. */
static unsigned char rnd8(fuzz *f)
{
    f->rng ^= f->rng << 13;
    f->rng ^= f->rng >> 7;
    f->rng ^= f->rng << 17;
    return (unsigned char)(f->rng >> 24);
}

/* ---- reporting ---- */

static void trace(fuzz *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(fuzz *f, const char *fmt, ...)
{
    char *line = f->trace[f->trace_n++ % TRACE_LINES];
    int n = snprintf(line, 96, "op %d: ", f->op_index);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, (size_t)(96 - n), fmt, ap);
    va_end(ap);
    if (f->verbose)
        fprintf(stderr, "%s\n", line);
}

static void fail(fuzz *f, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fail(fuzz *f, const char *fmt, ...)
{
    int first = f->trace_n > TRACE_LINES ? f->trace_n - TRACE_LINES : 0;
    fprintf(stderr, "fuzz: the last operations (of %d):\n", f->trace_n);
    for (int i = first; i < f->trace_n; i++)
        fprintf(stderr, "  %s\n", f->trace[i % TRACE_LINES]);
    fprintf(stderr, "fuzz: MISMATCH at op %d: ", f->op_index);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(last error: %s)\n", mapping_last_error_message());
    fflush(stderr);
    abort();
}

/* The call returns `expected`; a call that succeeds records no error (the
 * thread's last error stays as it was). */
#define EXPECT(f, expr, expected)                                                                   \
    do {                                                                                            \
        mapping_clear_last_error();                                                                 \
        mapping_status s_ = (expr), e_ = (expected);                                                \
        if (s_ != e_)                                                                               \
            fail(f, "%s returned %s, expected %s", #expr, mapping_status_name(s_),                 \
                 mapping_status_name(e_));                                                          \
        if (s_ == MAPPING_OK && mapping_last_error() != MAPPING_OK)                                 \
            fail(f, "%s succeeded but recorded an error", #expr);                                   \
    } while (0)

/* ---- set-up, once per process ---- */

static void count_host_fn(void *user)
{
    (void)user;
    atomic_fetch_add(&host_fn_runs, 1);
}

static int device_setup(fuzz_device *d, const mapping_device_desc *desc)
{
    mapping_status st = mapping_open(desc, &d->dev);
    if (st != MAPPING_OK) {
        printf("SKIP: back end %s: %s\n", desc->backend, mapping_last_error_message());
        d->dev = NULL;
        return st == MAPPING_ERR_NO_BACKEND || st == MAPPING_ERR_NO_DEVICE ? 77 : 1;
    }
    mapping_device_info info;
    if (mapping_device_get_info(d->dev, &info))
        return 1;
    fprintf(stderr, "fuzz: back end %s, device %s%s\n", info.backend, info.name,
            desc->link_latency > 0 ? ", a modelled slow link" : "");
    for (int i = 0; i < 2; i++)
        if (mapping_stream_create(d->dev, &d->streams[i]))
            return 1;
    for (int i = 0; i < NBUF; i++)
        if (mapping_allocate_gpu(d->dev, BUF_BYTES, &d->bufs[i]))
            return 1;
    if (mapping_allocate_gpu(d->dev, MIRROR_MAX, &d->scratch))
        return 1;
    if (mapping_sync_to_gpu(scratch_host, d->scratch))
        return 1;
    return 0;
}

int fuzz_setup(void)
{
    if (n_devices)
        return 0;
    const char *backend = getenv("MAPPING_BACKEND");
    mapping_device_desc desc = {.backend = backend && *backend ? backend : "host"};
    for (size_t i = 0; i < MIRROR_MAX; i++)
        scratch_host[i] = (unsigned char)(i * 131 + 7);
    int st = device_setup(&devices[0], &desc);
    if (st != 0)
        return st;
    n_devices = 1;
    if (strcmp(desc.backend, "host") == 0) {
        desc.link_latency = 20e-6;
        desc.link_bandwidth = 4e9;
        if ((st = device_setup(&devices[1], &desc)) != 0)
            return st;
        n_devices = 2;
    }
    return 0;
}

unsigned long long fuzz_tracked_rounds(void)
{
    return total_tracked_rounds;
}

void fuzz_totals(unsigned long long *ops, unsigned long long *bytes_checked)
{
    *ops = total_ops;
    *bytes_checked = total_bytes_checked;
}

/* ---- streams ---- */

/* 0, 1: a stream; 2: NULL (blocking). */
static int pick_stream(fuzz *f)
{
    return (int)(u8(f) % 3);
}

static mapping_stream *stream_of(int k)
{
    return k < 2 ? D->streams[k] : NULL;
}

static void sync_streams(fuzz *f)
{
    for (int i = 0; i < 2; i++)
        EXPECT(f, mapping_stream_synchronize(D->streams[i]), MAPPING_OK);
    f->busy[0] = f->busy[1] = 0;
}

/* Orders buffer-world work about to go on stream k after all earlier
 * buffer-world work: joins the other stream by an event, or, for blocking
 * work (k == 2), waits for both. */
static void order_before(fuzz *f, int k)
{
    if (k == 2) {
        for (int i = 0; i < 2; i++)
            if (f->busy[i]) {
                EXPECT(f, mapping_stream_synchronize(D->streams[i]), MAPPING_OK);
                f->busy[i] = 0;
            }
        return;
    }
    int other = 1 - k;
    if (f->busy[other]) {
        mapping_event *ev;
        EXPECT(f, mapping_event_record(D->streams[other], &ev), MAPPING_OK);
        EXPECT(f, mapping_stream_wait_event(D->streams[k], ev), MAPPING_OK);
        mapping_event_destroy(ev);
        f->busy[other] = 0;
    }
    f->busy[k] = 1;
}

/* ---- the mirror model ---- */

static int model_conflict(fuzz *f, int x, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++)
        if (f->mod[1 - x][i])
            return 1;
    return 0;
}

static void model_mark(fuzz *f, int x, size_t lo, size_t hi, int discard)
{
    for (size_t i = lo; i < hi; i++) {
        if (discard)
            f->mod[1 - x][i] = 0;
        f->stale[1 - x][i] = 1;
        f->mod[x][i] = 1;
        f->stale[x][i] = 0;
    }
}

static void model_sync(fuzz *f, int t, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++)
        if (f->stale[t][i]) {
            f->stale[t][i] = 0;
            f->mod[1 - t][i] = 0;
        }
}

static size_t model_stale(fuzz *f, int side, size_t lo, size_t hi)
{
    size_t n = 0;
    for (size_t i = lo; i < hi; i++)
        n += f->stale[side][i];
    return n;
}

static int live_handles(fuzz *f)
{
    int n = 0;
    for (int i = 0; i <= MAX_VIEWS; i++)
        n += f->handles[i] != NULL;
    return n;
}

/* A live handle chosen by the next byte. */
static mapping_mirror *pick_handle(fuzz *f)
{
    int live = live_handles(f), k = (int)(u8(f) % (unsigned)live);
    for (int i = 0; i <= MAX_VIEWS; i++)
        if (f->handles[i] && k-- == 0)
            return f->handles[i];
    return NULL;
}

/* A range inside handle h, in the family's offsets. */
static void sub_range(fuzz *f, mapping_mirror *h, size_t *lo, size_t *hi)
{
    size_t size = mapping_mirror_size(h);
    unsigned a = u16(f), b = u16(f);
    size_t off = a % size, len = 1 + (b & 0x8000 ? b % size : b % 64);
    *lo = mapping_mirror_gpu_offset(h) + off;
    *hi = *lo + (len > size - off ? size - off : len);
}

static void check_mirror(fuzz *f)
{
    sync_streams(f);
    if (f->handles[0])
        for (int side = 0; side < 2; side++) {
            size_t got = mapping_mirror_stale_bytes(f->handles[0], (mapping_side)(side + 1));
            size_t want = model_stale(f, side, 0, f->msize);
            if (got != want)
                fail(f, "stale bytes on side %d: %zu, model %zu", side + 1, got, want);
        }
    EXPECT(f, mapping_sync_to_cpu_range(NULL, f->root_gpu, 0, f->readback, f->msize), MAPPING_OK);
    for (size_t i = 0; i < f->msize; i++) {
        if (f->stale[0][i] && f->stale[1][i])
            fail(f, "model: byte %zu stale on both sides", i);
        if (!f->stale[0][i] && f->root_cpu[i] != f->value[i])
            fail(f, "mirror CPU byte %zu is 0x%02x, model 0x%02x", i, f->root_cpu[i], f->value[i]);
        if (!f->stale[1][i] && f->readback[i] != f->value[i])
            fail(f, "mirror GPU byte %zu is 0x%02x, model 0x%02x", i, f->readback[i], f->value[i]);
    }
    total_bytes_checked += 2 * f->msize;
}

/* ---- mirror operations ---- */

/* Writes [lo, hi) on the device directly (blocking fill or copy), as a
 * kernel would; the caller has made sure nothing queued touches it. */
static void device_write(fuzz *f, mapping_stream *s, mapping_buffer *buf, size_t lo, size_t hi)
{
    if (u8(f) & 1) {
        unsigned char v = (unsigned char)u8(f);
        EXPECT(f, mapping_fill_gpu(s, buf, lo, hi - lo, v), MAPPING_OK);
        memset(f->value + lo, v, hi - lo);
    } else {
        size_t src = u16(f) % (MIRROR_MAX - (hi - lo) + 1);
        EXPECT(f, mapping_copy_gpu(s, D->scratch, src, buf, lo, hi - lo), MAPPING_OK);
        memcpy(f->value + lo, scratch_host + src, hi - lo);
    }
}

static void op_mirror_write_and_mark(fuzz *f, int x)
{
    mapping_mirror *h = pick_handle(f);
    size_t lo, hi, base = mapping_mirror_gpu_offset(h);
    sub_range(f, h, &lo, &hi);
    trace(f, "mirror %s write+mark [%zu,%zu)", x ? "GPU" : "CPU", lo, hi);
    mapping_status (*mark)(mapping_mirror *, size_t, size_t) =
        x ? mapping_mirror_mark_gpu_modified : mapping_mirror_mark_cpu_modified;
    if (model_conflict(f, x, lo, hi)) {
        EXPECT(f, mark(h, lo - base, hi - lo), MAPPING_ERR_CONFLICT);
        return;
    }
    sync_streams(f); /* queued copies may use these bytes */
    if (x) {
        device_write(f, NULL, f->root_gpu, lo, hi);
    } else {
        for (size_t i = lo; i < hi; i++)
            f->root_cpu[i] = f->value[i] = rnd8(f);
    }
    EXPECT(f, mark(h, lo - base, hi - lo), MAPPING_OK);
    model_mark(f, x, lo, hi, 0);
}

static void op_mirror_acquire_gpu(fuzz *f)
{
    mapping_mirror *h = pick_handle(f);
    int k = pick_stream(f);
    unsigned access = 1 + u8(f) % 3; /* READ, WRITE, READ|WRITE */
    size_t base = mapping_mirror_gpu_offset(h), size = mapping_mirror_size(h), lo = base, hi = base + size;
    trace(f, "mirror acquire_gpu access %u stream %d [%zu,%zu)", access, k, base, base + size);
    mapping_buffer *buf;
    EXPECT(f, mapping_mirror_acquire_gpu(stream_of(k), h, access, &buf), MAPPING_OK);
    if (buf != f->root_gpu)
        fail(f, "acquire_gpu gave buffer %p, the family's is %p", (void *)buf, (void *)f->root_gpu);
    if (access & MAPPING_READ)
        model_sync(f, 1, base, base + size);
    if (access & MAPPING_WRITE) {
        model_mark(f, 1, base, base + size, !(access & MAPPING_READ));
        if (access & MAPPING_READ)
            sub_range(f, h, &lo, &hi); /* read-write: change part of it */
        device_write(f, stream_of(k), buf, lo, hi);
    }
    EXPECT(f, mapping_mirror_release_gpu(stream_of(k), h), MAPPING_OK);
}

static void op_mirror_acquire_cpu(fuzz *f)
{
    mapping_mirror *h = pick_handle(f);
    unsigned access = 1 + u8(f) % 3;
    size_t base = mapping_mirror_gpu_offset(h), size = mapping_mirror_size(h), lo = base, hi = base + size;
    trace(f, "mirror acquire_cpu access %u [%zu,%zu)", access, base, base + size);
    unsigned char *p;
    EXPECT(f, mapping_mirror_acquire_cpu(h, access, (void **)&p), MAPPING_OK);
    if (p != f->root_cpu + base)
        fail(f, "acquire_cpu gave %p, the view starts at %p", (void *)p, (void *)(f->root_cpu + base));
    if (access & MAPPING_READ) {
        model_sync(f, 0, base, base + size);
        for (size_t i = 0; i < size; i++)
            if (p[i] != f->value[base + i])
                fail(f, "acquired CPU byte %zu is 0x%02x, model 0x%02x", base + i, p[i], f->value[base + i]);
        total_bytes_checked += size;
    }
    if (access & MAPPING_WRITE) {
        model_mark(f, 0, base, base + size, !(access & MAPPING_READ));
        if (access & MAPPING_READ)
            sub_range(f, h, &lo, &hi);
        for (size_t i = lo; i < hi; i++)
            p[i - base] = f->value[i] = rnd8(f);
    }
}

static void op_mirror_sync(fuzz *f, int t)
{
    mapping_mirror *h = pick_handle(f);
    int k = pick_stream(f);
    size_t base = mapping_mirror_gpu_offset(h), size = mapping_mirror_size(h);
    trace(f, "mirror sync_to_%s stream %d [%zu,%zu)", t ? "gpu" : "cpu", k, base, base + size);
    EXPECT(f, (t ? mapping_mirror_sync_to_gpu : mapping_mirror_sync_to_cpu)(stream_of(k), h), MAPPING_OK);
    model_sync(f, t, base, base + size);
}

static void op_mirror_stale(fuzz *f)
{
    mapping_mirror *h = pick_handle(f);
    int side = (int)(u8(f) % 2);
    size_t base = mapping_mirror_gpu_offset(h), size = mapping_mirror_size(h);
    trace(f, "mirror stale_bytes side %d [%zu,%zu)", side + 1, base, base + size);
    size_t got = mapping_mirror_stale_bytes(h, (mapping_side)(side + 1));
    size_t want = model_stale(f, side, base, base + size);
    if (got != want)
        fail(f, "view [%zu,+%zu) stale on side %d: %zu, model %zu", base, size, side + 1, got, want);
}

static void op_mirror_view(fuzz *f)
{
    mapping_mirror *h = pick_handle(f);
    size_t size = mapping_mirror_size(h), off = u16(f) % size, len = 1 + u16(f) % (size - off);
    trace(f, "mirror view of [%zu,+%zu) at %zu, %zu bytes", mapping_mirror_gpu_offset(h), size, off, len);
    int slot = 0;
    for (int i = 1; i <= MAX_VIEWS && !slot; i++)
        if (!f->handles[i])
            slot = i;
    if (!slot) { /* full: replace a view other than h */
        slot = 1 + (int)(u8(f) % MAX_VIEWS);
        if (f->handles[slot] == h)
            slot = slot == MAX_VIEWS ? 1 : slot + 1;
        mapping_mirror_destroy(f->handles[slot]);
        f->handles[slot] = NULL;
    }
    mapping_mirror *v;
    EXPECT(f, mapping_mirror_view(h, off, len, &v), MAPPING_OK);
    if (mapping_mirror_size(v) != len || mapping_mirror_gpu_offset(v) != mapping_mirror_gpu_offset(h) + off ||
        mapping_mirror_cpu(v) != f->root_cpu + mapping_mirror_gpu_offset(v) || mapping_mirror_gpu(v) != f->root_gpu)
        fail(f, "the new view's size, offset, or pointers are wrong");
    f->handles[slot] = v;
}

/* Destroys a handle (the root too), keeping at least one alive. */
static void op_mirror_destroy(fuzz *f)
{
    mapping_mirror *h = pick_handle(f);
    if (live_handles(f) < 2)
        return;
    trace(f, "mirror destroy handle [%zu,+%zu)", mapping_mirror_gpu_offset(h), mapping_mirror_size(h));
    for (int i = 0; i <= MAX_VIEWS; i++)
        if (f->handles[i] == h)
            f->handles[i] = NULL;
    mapping_mirror_destroy(h);
}

/* Refused marks and views change nothing. */
static void op_mirror_refused(fuzz *f)
{
    mapping_mirror *h = pick_handle(f);
    size_t size = mapping_mirror_size(h), off = u16(f) % (size + 1);
    int zero = u8(f) & 1;
    size_t len = zero ? 0 : size - off + 1 + u8(f);
    mapping_status want = zero ? MAPPING_ERR_ZERO_SIZE : MAPPING_ERR_OUT_OF_RANGE;
    trace(f, "mirror refused mark/view at %zu, %zu bytes", off, len);
    size_t stale0 = mapping_mirror_stale_bytes(h, MAPPING_CPU), stale1 = mapping_mirror_stale_bytes(h, MAPPING_GPU);
    mapping_mirror *v = NULL;
    switch (u8(f) % 3) {
    case 0: EXPECT(f, mapping_mirror_mark_cpu_modified(h, off, len), want); break;
    case 1: EXPECT(f, mapping_mirror_mark_gpu_modified(h, off, len), want); break;
    default:
        EXPECT(f, mapping_mirror_view(h, off, len, &v), want);
        if (v)
            fail(f, "a refused view wrote a handle");
    }
    if (mapping_last_error() != want || !mapping_last_error_message()[0])
        fail(f, "a refused call did not record its error with a message");
    if (mapping_mirror_stale_bytes(h, MAPPING_CPU) != stale0 || mapping_mirror_stale_bytes(h, MAPPING_GPU) != stale1)
        fail(f, "a refused call changed the mirror's state");
}

/* ---- the buffer world ---- */

/* A device range [*off, +*len) in a buffer and a host offset, all within
 * bounds; large (straight-through) sizes now and then. */
static void buf_range(fuzz *f, size_t *off, size_t *host_off, size_t *len)
{
    unsigned sel = u8(f);
    size_t n = sel & 0x80 ? LARGE_MIN + u16(f) % (BUF_BYTES - LARGE_MIN + 1)
             : sel & 0x40 ? 1 + u16(f) % 4096
                          : 1 + u8(f) % 128;
    *len = n;
    *off = u16(f) % (BUF_BYTES - n + 1);
    *host_off = u16(f) % (BUF_BYTES - n + 1);
}

static void model_h2d(fuzz *f, int b, size_t off, const unsigned char *src, size_t n)
{
    memcpy(f->dv[b] + off, src, n);
}

static void model_d2h(fuzz *f, int b, size_t off, size_t host_off, size_t n)
{
    memcpy(f->hd_model + host_off, f->dv[b] + off, n);
    memset(f->hd_known + host_off, 1, n);
}

static void op_batch_add(fuzz *f, int to_gpu)
{
    int b = (int)(u8(f) % NBUF);
    size_t off, host_off, n;
    buf_range(f, &off, &host_off, &n);
    trace(f, "batch add %s buf %d [%zu,+%zu) host %zu", to_gpu ? "h2d" : "d2h", b, off, n, host_off);
    if (f->nq == MAX_QUEUED)
        return;
    if (to_gpu)
        EXPECT(f, mapping_batch_add_to_gpu(f->batch, f->hs + host_off, D->bufs[b], off, n), MAPPING_OK);
    else
        EXPECT(f, mapping_batch_add_to_cpu(f->batch, D->bufs[b], off, f->hd + host_off, n), MAPPING_OK);
    f->q[f->nq++] = (queued){to_gpu, b, off, host_off, n};
    if (mapping_batch_count(f->batch) != f->nq)
        fail(f, "batch count %zu, model %zu", mapping_batch_count(f->batch), f->nq);
}

static void op_batch_refused(fuzz *f)
{
    int b = (int)(u8(f) % NBUF), zero = u8(f) & 1;
    size_t off = u16(f) % (BUF_BYTES + 1), n = zero ? 0 : BUF_BYTES - off + 1 + u8(f);
    mapping_status want = zero ? MAPPING_ERR_ZERO_SIZE : MAPPING_ERR_OUT_OF_RANGE;
    trace(f, "batch refused add buf %d [%zu,+%zu)", b, off, n);
    if (u8(f) & 1)
        EXPECT(f, mapping_batch_add_to_gpu(f->batch, f->hs, D->bufs[b], off, n), want);
    else
        EXPECT(f, mapping_batch_add_to_cpu(f->batch, D->bufs[b], off, f->hd, n), want);
    if (mapping_batch_count(f->batch) != f->nq)
        fail(f, "a refused add changed the count: %zu, model %zu", mapping_batch_count(f->batch), f->nq);
}

static void op_batch_flush(fuzz *f)
{
    int k = pick_stream(f);
    trace(f, "batch flush stream %d, %zu copies", k, f->nq);
    if (f->nq == 0) {
        EXPECT(f, mapping_batch_flush(stream_of(k), f->batch), MAPPING_OK);
        return;
    }
    order_before(f, k);
    EXPECT(f, mapping_batch_flush(stream_of(k), f->batch), MAPPING_OK);
    if (mapping_batch_count(f->batch) != 0)
        fail(f, "%zu copies left after a successful flush", mapping_batch_count(f->batch));
    /* Host-to-device first, in order (the later wins); then device-to-host,
     * where host bytes written twice by one flush are unspecified. */
    f->flush_id++;
    for (size_t i = 0; i < f->nq; i++)
        if (f->q[i].to_gpu)
            model_h2d(f, f->q[i].buf, f->q[i].dev_off, f->hs + f->q[i].host_off, f->q[i].bytes);
    for (size_t i = 0; i < f->nq; i++) {
        const queued *c = &f->q[i];
        if (c->to_gpu)
            continue;
        model_d2h(f, c->buf, c->dev_off, c->host_off, c->bytes);
        for (size_t j = c->host_off; j < c->host_off + c->bytes; j++) {
            if (f->hd_stamp[j] == f->flush_id)
                f->hd_dup[j] = f->flush_id;
            f->hd_stamp[j] = f->flush_id;
        }
    }
    for (size_t i = 0; i < f->nq; i++) {
        const queued *c = &f->q[i];
        for (size_t j = c->host_off; !c->to_gpu && j < c->host_off + c->bytes; j++)
            if (f->hd_dup[j] == f->flush_id)
                f->hd_known[j] = 0;
    }
    f->nq = 0;
}

static void op_batch_clear(fuzz *f, int recreate)
{
    trace(f, "batch %s (%zu copies dropped)", recreate ? "destroy+create" : "clear", f->nq);
    if (recreate) {
        mapping_batch_destroy(f->batch);
        EXPECT(f, mapping_batch_create(D->dev, &f->batch), MAPPING_OK);
    } else {
        mapping_batch_clear(f->batch);
    }
    f->nq = 0;
    if (mapping_batch_count(f->batch) != 0)
        fail(f, "a cleared batch counts %zu copies", mapping_batch_count(f->batch));
}

static void op_direct(fuzz *f, int what)
{
    int b = (int)(u8(f) % NBUF), k = pick_stream(f);
    size_t off, host_off, n;
    buf_range(f, &off, &host_off, &n);
    mapping_stream *s = stream_of(k);
    switch (what) {
    case 0:
        trace(f, "sync_to_gpu_range stream %d buf %d [%zu,+%zu) host %zu", k, b, off, n, host_off);
        order_before(f, k);
        EXPECT(f, mapping_sync_to_gpu_range(s, f->hs + host_off, D->bufs[b], off, n), MAPPING_OK);
        model_h2d(f, b, off, f->hs + host_off, n);
        break;
    case 1:
        trace(f, "sync_to_cpu_range stream %d buf %d [%zu,+%zu) host %zu", k, b, off, n, host_off);
        order_before(f, k);
        EXPECT(f, mapping_sync_to_cpu_range(s, D->bufs[b], off, f->hd + host_off, n), MAPPING_OK);
        model_d2h(f, b, off, host_off, n);
        break;
    case 2: {
        unsigned char v = (unsigned char)u8(f);
        trace(f, "fill_gpu stream %d buf %d [%zu,+%zu) = 0x%02x", k, b, off, n, v);
        order_before(f, k);
        EXPECT(f, mapping_fill_gpu(s, D->bufs[b], off, n, v), MAPPING_OK);
        memset(f->dv[b] + off, v, n);
        break;
    }
    default: {
        int b2 = (int)(u8(f) % NBUF);
        size_t dst = host_off; /* a second offset in range */
        trace(f, "copy_gpu stream %d buf %d [%zu,+%zu) -> buf %d at %zu", k, b, off, n, b2, dst);
        if (b == b2 && off < dst + n && dst < off + n) {
            EXPECT(f, mapping_copy_gpu(s, D->bufs[b], off, D->bufs[b2], dst, n), MAPPING_ERR_OVERLAP);
            break;
        }
        order_before(f, k);
        EXPECT(f, mapping_copy_gpu(s, D->bufs[b], off, D->bufs[b2], dst, n), MAPPING_OK);
        memmove(f->dv[b2] + dst, f->dv[b] + off, n);
    }
    }
}

static void op_host_write(fuzz *f)
{
    size_t off = u16(f) % BUF_BYTES, n = 1 + u16(f) % (BUF_BYTES - off);
    trace(f, "host source write [%zu,+%zu)", off, n);
    order_before(f, 2); /* queued work may read these bytes */
    for (size_t i = 0; i < n; i++)
        f->hs[off + i] = rnd8(f);
}

static void check_buffers(fuzz *f)
{
    order_before(f, 2);
    for (int b = 0; b < NBUF; b++) {
        EXPECT(f, mapping_sync_to_cpu_range(NULL, D->bufs[b], 0, f->readback, BUF_BYTES), MAPPING_OK);
        if (memcmp(f->readback, f->dv[b], BUF_BYTES) == 0)
            continue;
        for (size_t i = 0; i < BUF_BYTES; i++)
            if (f->readback[i] != f->dv[b][i])
                fail(f, "buffer %d byte %zu is 0x%02x, model 0x%02x", b, i, f->readback[i], f->dv[b][i]);
    }
    int differs = memcmp(f->hd, f->hd_model, BUF_BYTES) != 0; /* only then look byte by byte */
    for (size_t i = 0; differs && i < BUF_BYTES; i++) {
        if (f->hd_known[i] && f->hd[i] != f->hd_model[i])
            fail(f, "host destination byte %zu is 0x%02x, model 0x%02x", i, f->hd[i], f->hd_model[i]);
        if (!f->hd_known[i]) { /* unspecified until written again: take what is there */
            f->hd_model[i] = f->hd[i];
            f->hd_known[i] = 1;
        }
    }
    total_bytes_checked += (NBUF + 1) * (unsigned long long)BUF_BYTES;
    if (atomic_load(&host_fn_runs) - f->runs_at_start != f->host_fns)
        fail(f, "%u host functions ran, %u were launched", atomic_load(&host_fn_runs) - f->runs_at_start,
             f->host_fns);
}

/* ---- pipelines ---- */

static mapping_status pipeline_step(mapping_stream *stream, const mapping_pipeline_chunk *c, void *user)
{
    (void)user; /* the identity: output = input */
    return mapping_copy_gpu(stream, c->input, c->input_offset, c->output, c->output_offset, c->bytes);
}

/* Runs part of the host sources through a pipeline (made on first use, with
 * a chunk size and depth from the input) into the host destinations. */
static void op_pipeline(fuzz *f)
{
    unsigned sel = u8(f);
    size_t n = 1 + u16(f) % BUF_BYTES, src = u16(f) % (BUF_BYTES - n + 1), dst = u16(f) % (BUF_BYTES - n + 1);
    if (!f->pipe) {
        mapping_pipeline_desc desc = {.chunk_bytes = (size_t)4096 << (sel % 5), .depth = 1 + (int)(sel / 5 % 3)};
        trace(f, "pipeline create, chunks of %zu bytes, depth %d", desc.chunk_bytes, desc.depth);
        EXPECT(f, mapping_pipeline_create(D->dev, &desc, &f->pipe), MAPPING_OK);
    }
    trace(f, "pipeline run of %zu bytes, host source %zu -> destination %zu", n, src, dst);
    order_before(f, 2); /* earlier work may still use these host bytes */
    EXPECT(f, mapping_pipeline_run(f->pipe, f->hs + src, f->hd + dst, n, pipeline_step, NULL), MAPPING_OK);
    memcpy(f->hd_model + dst, f->hs + src, n);
    memset(f->hd_known + dst, 1, n);
}

/* ---- streams, events, host functions, the link ---- */

static void op_event(fuzz *f)
{
    int a = (int)(u8(f) % 2), how = (int)(u8(f) % 3);
    trace(f, "event on stream %d, %s", a, how == 0 ? "joined into the other" : how == 1 ? "synchronized" : "queried");
    mapping_event *ev;
    EXPECT(f, mapping_event_record(D->streams[a], &ev), MAPPING_OK);
    if (how == 0) {
        EXPECT(f, mapping_stream_wait_event(D->streams[1 - a], ev), MAPPING_OK);
        if (f->busy[a])
            f->busy[1 - a] = 1, f->busy[a] = 0;
    } else if (how == 1) {
        EXPECT(f, mapping_event_synchronize(ev), MAPPING_OK);
        EXPECT(f, mapping_event_query(ev), MAPPING_OK);
        f->busy[a] = 0;
    } else {
        mapping_status st = mapping_event_query(ev);
        if (st != MAPPING_OK && st != MAPPING_ERR_NOT_READY)
            fail(f, "mapping_event_query returned %s", mapping_status_name(st));
    }
    mapping_event_destroy(ev);
}

static void op_host_fn(fuzz *f)
{
    int k = pick_stream(f);
    trace(f, "launch_host stream %d", k);
    if (k < 2)
        order_before(f, k); /* counted as buffer-world work: checks wait for it */
    EXPECT(f, mapping_launch_host(stream_of(k), count_host_fn, NULL), MAPPING_OK);
    f->host_fns++;
}

static void op_stream_sync(fuzz *f)
{
    int k = (int)(u8(f) % 2);
    trace(f, "stream_synchronize %d", k);
    EXPECT(f, mapping_stream_synchronize(D->streams[k]), MAPPING_OK);
    f->busy[k] = 0;
}

static const mapping_link links[] = {
    {1e-3, 1e9},   /* every gap merged, mirror syncs batched, batches all staged */
    {1e-12, 1e9},  /* nothing merged, no batching of syncs */
    {5e-6, 1e10},  /* in between: straight-through from 200 KB */
    {2e-6, 25e9},
};

static void set_link(fuzz *f, unsigned which)
{
    const mapping_link *l = &links[which % (sizeof links / sizeof links[0])];
    trace(f, "set link latency %g s, bandwidth %g B/s", l->latency, l->bandwidth);
    EXPECT(f, mapping_device_set_link(D->dev, l), MAPPING_OK);
}

/* ---- the tracked world ---- */

/* A view of the tracked mirror, or the mirror itself, from the next bytes. */
static mapping_mirror *tracked_view(fuzz *f, size_t *lo, size_t *hi)
{
    mapping_mirror *v = NULL;
    *lo = u16(f) % f->tsize;
    *hi = *lo + 1 + u16(f) % (f->tsize - *lo);
    if (u8(f) & 1 || mapping_mirror_view(f->tracked, *lo, *hi - *lo, &v) != MAPPING_OK) {
        *lo = 0;
        *hi = f->tsize;
        return NULL; /* the mirror itself */
    }
    return v;
}

static void tracked_check(fuzz *f, int cpu_side)
{
    unsigned char *cpu = mapping_mirror_cpu(f->tracked);
    if (cpu_side) {
        for (size_t i = 0; i < f->tsize; i++)
            if (cpu[i] != f->tvalue[i])
                fail(f, "tracked mirror CPU byte %zu is 0x%02x, model 0x%02x", i, cpu[i], f->tvalue[i]);
    } else {
        EXPECT(f, mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(f->tracked), 0, f->readback, f->tsize), MAPPING_OK);
        for (size_t i = 0; i < f->tsize; i++)
            if (f->readback[i] != f->tvalue[i])
                fail(f, "tracked mirror GPU byte %zu is 0x%02x, model 0x%02x", i, f->readback[i], f->tvalue[i]);
    }
    total_bytes_checked += f->tsize;
}

/* One round: the CPU side is synced from the device first (so no byte is
 * modified on both sides), the CPU writes with no mark, part of it may go
 * up by a view's sync, the device writes a view it acquired read-write
 * (which syncs the view first), and everything comes down: the CPU must
 * hold the model; then everything goes up: the device must too. */
static void op_tracked_round(fuzz *f)
{
    if (mapping_write_tracking(NULL) == MAPPING_TRACK_NONE)
        return;
    total_tracked_rounds++;
    if (!f->tracked) {
        f->tsize = 1 + u16(f) % TRACK_MAX;
        trace(f, "tracked mirror create %zu bytes", f->tsize);
        EXPECT(f, mapping_mirror_create(D->dev, f->tsize, MAPPING_MIRROR_TRACK_WRITES, &f->tracked), MAPPING_OK);
        memset(f->tvalue, 0, f->tsize);
        EXPECT(f, mapping_mirror_sync_to_gpu(NULL, f->tracked), MAPPING_OK);
    }
    unsigned char *cpu = mapping_mirror_cpu(f->tracked);
    EXPECT(f, mapping_mirror_sync_to_cpu(NULL, f->tracked), MAPPING_OK);
    for (int w = (int)(u8(f) % 5); w-- > 0;) {
        size_t lo = u16(f) % f->tsize, len = 1 + (u8(f) & 0x80 ? u16(f) : u8(f) % 64) % (f->tsize - lo);
        unsigned how = u8(f) % 4;
        unsigned char v = rnd8(f);
        trace(f, "tracked CPU write [%zu,+%zu) by %s, no mark", lo, len,
              how == 0 ? "stores" : how == 1 ? "memset" : how == 2 ? "memcpy" : "read(2)");
        if (how == 3 && mapping_write_tracking(NULL) == MAPPING_TRACK_MPROTECT)
            how = 1; /* under mprotect the kernel cannot write an unmarked page (EFAULT): documented */
        if (how == 0) {
            for (size_t i = 0; i < len; i++)
                cpu[lo + i] = f->tvalue[lo + i] = rnd8(f);
        } else if (how == 1) {
            memset(cpu + lo, v, len);
            memset(f->tvalue + lo, v, len);
        } else if (how == 2) {
            size_t src = u16(f) % (MIRROR_MAX - (len < MIRROR_MAX ? len : MIRROR_MAX) + 1);
            size_t n = len < MIRROR_MAX ? len : MIRROR_MAX;
            memcpy(cpu + lo, scratch_host + src, n);
            memcpy(f->tvalue + lo, scratch_host + src, n);
        } else {
            int fds[2];
            size_t n = len < 4096 ? len : 4096; /* one pipe buffer */
            if (pipe(fds) != 0)
                continue;
            memset(f->readback, v, n);
            if (write(fds[1], f->readback, n) != (ssize_t)n || read(fds[0], cpu + lo, n) != (ssize_t)n)
                fail(f, "read(2) from a pipe into the tracked mirror failed");
            memset(f->tvalue + lo, v, n);
            close(fds[0]);
            close(fds[1]);
        }
    }
    if (u8(f) & 1) { /* part of it goes up now */
        size_t lo, hi;
        mapping_mirror *v = tracked_view(f, &lo, &hi);
        int k = pick_stream(f);
        trace(f, "tracked sync_to_gpu of [%zu,%zu) stream %d", lo, hi, k);
        EXPECT(f, mapping_mirror_sync_to_gpu(stream_of(k), v ? v : f->tracked), MAPPING_OK);
        mapping_mirror_destroy(v);
    }
    if (u8(f) & 1) { /* the device writes a view */
        size_t lo, hi;
        mapping_mirror *v = tracked_view(f, &lo, &hi);
        int k = pick_stream(f);
        mapping_buffer *buf;
        trace(f, "tracked acquire_gpu read-write [%zu,%zu) stream %d, device write", lo, hi, k);
        EXPECT(f, mapping_mirror_acquire_gpu(stream_of(k), v ? v : f->tracked, MAPPING_READ | MAPPING_WRITE, &buf),
               MAPPING_OK);
        size_t a = lo + u16(f) % (hi - lo), b = a + 1 + u16(f) % (hi - a);
        unsigned char val = rnd8(f);
        EXPECT(f, mapping_fill_gpu(stream_of(k), buf, a, b - a, val), MAPPING_OK);
        memset(f->tvalue + a, val, b - a);
        EXPECT(f, mapping_mirror_release_gpu(stream_of(k), v ? v : f->tracked), MAPPING_OK);
        mapping_mirror_destroy(v);
    }
    int k = pick_stream(f);
    trace(f, "tracked sync_to_cpu stream %d, then sync_to_gpu", k);
    EXPECT(f, mapping_mirror_sync_to_cpu(stream_of(k), f->tracked), MAPPING_OK);
    sync_streams(f);
    tracked_check(f, 1);
    EXPECT(f, mapping_mirror_sync_to_gpu(stream_of(k), f->tracked), MAPPING_OK);
    sync_streams(f);
    tracked_check(f, 0);
}

/* ---- one input ---- */

static void begin(fuzz *f)
{
    int which = (int)(u8(f) % (unsigned)n_devices);
    D = &devices[which];
    trace(f, "device %d%s", which, which ? " (a modelled slow link)" : "");
    unsigned size_sel = u16(f), how = u8(f);
    f->msize = 1 + size_sel % MIRROR_MAX;
    set_link(f, how >> 4);
    mapping_mirror *root;
    if (how % 4 == 3) {
        f->wrapped = aligned_alloc(64, (f->msize + 63) / 64 * 64);
        for (size_t i = 0; i < f->msize; i++)
            ((unsigned char *)f->wrapped)[i] = f->value[i] = rnd8(f);
        trace(f, "mirror wrap %zu bytes%s", f->msize, how & 4 ? ", pinned" : "");
        EXPECT(f, mapping_mirror_wrap(D->dev, f->wrapped, f->msize, how & 4 ? MAPPING_MIRROR_PIN : 0, &root),
               MAPPING_OK);
    } else {
        unsigned flags = how % 4 == 2 ? MAPPING_MIRROR_UNIFIED : 0;
        trace(f, "mirror create %zu bytes%s", f->msize, flags ? ", unified" : "");
        EXPECT(f, mapping_mirror_create(D->dev, f->msize, flags, &root), MAPPING_OK);
        memset(f->value, 0, f->msize); /* zero-filled */
    }
    f->handles[0] = root;
    f->root_cpu = mapping_mirror_cpu(root);
    f->root_gpu = mapping_mirror_gpu(root);
    if (!f->root_cpu || !f->root_gpu || mapping_mirror_size(root) != f->msize)
        fail(f, "a new mirror's pointers or size are wrong");
    memset(f->stale[1], 1, f->msize);
    EXPECT(f, mapping_batch_create(D->dev, &f->batch), MAPPING_OK);
    for (size_t i = 0; i < BUF_BYTES; i += 8) { /* 8 bytes a step: this runs for every input */
        rnd8(f);
        memcpy(f->hs + i, &f->rng, 8);
    }
    memset(f->hd, 0, sizeof f->hd);
    for (int b = 0; b < NBUF; b++) {
        unsigned char v = rnd8(f);
        EXPECT(f, mapping_fill_gpu(NULL, D->bufs[b], 0, BUF_BYTES, v), MAPPING_OK);
        memset(f->dv[b], v, BUF_BYTES);
    }
    f->runs_at_start = atomic_load(&host_fn_runs);
}

static void end(fuzz *f)
{
    check_mirror(f);
    check_buffers(f);
    mapping_batch_destroy(f->batch);
    mapping_pipeline_destroy(f->pipe);
    for (int i = MAX_VIEWS; i >= 0; i--)
        if (f->handles[i])
            mapping_mirror_destroy(f->handles[i]);
    mapping_mirror_destroy(f->tracked);
    free(f->wrapped);
    sync_streams(f);
}

int fuzz_run(const uint8_t *data, size_t size)
{
    fuzz *f = &F;
    memset(f, 0, offsetof(fuzz, hs)); /* the arrays below are reset where used */
    memset(f->stale, 0, sizeof f->stale);
    memset(f->mod, 0, sizeof f->mod);
    memset(f->hd_known, 1, sizeof f->hd_known);
    memset(f->hd_model, 0, sizeof f->hd_model);
    memset(f->hd_stamp, 0, sizeof f->hd_stamp);
    memset(f->hd_dup, 0, sizeof f->hd_dup);
    f->flush_id = 1;
    f->host_fns = 0;
    f->data = data;
    f->size = size;
    f->rng = 0x9e3779b97f4a7c15ull ^ size;
    for (size_t i = 0; i < size && i < 16; i++)
        f->rng = f->rng * 31 + data[i] + 1;
    const char *v = getenv("MAPPING_FUZZ_TRACE");
    f->verbose = v && *v == '1';
    if (fuzz_setup() != 0) {
        fprintf(stderr, "fuzz: no device\n");
        abort();
    }
    begin(f);
    for (f->op_index = 0; f->pos < f->size && f->op_index < MAX_OPS; f->op_index++) {
        total_ops++;
        switch (u8(f) % 29) {
        case 0: case 1: op_mirror_write_and_mark(f, 0); break;
        case 2: case 3: op_mirror_write_and_mark(f, 1); break;
        case 4: op_mirror_acquire_gpu(f); break;
        case 5: op_mirror_acquire_cpu(f); break;
        case 6: op_mirror_sync(f, 1); break;
        case 7: op_mirror_sync(f, 0); break;
        case 8: op_mirror_stale(f); break;
        case 9: op_mirror_view(f); break;
        case 10: op_mirror_destroy(f); break;
        case 11: op_mirror_refused(f); break;
        case 12: check_mirror(f); break;
        case 13: case 14: op_batch_add(f, 1); break;
        case 15: case 16: op_batch_add(f, 0); break;
        case 17: op_batch_flush(f); break;
        case 18: op_batch_clear(f, u8(f) & 1); break;
        case 19: op_batch_refused(f); break;
        case 20: op_direct(f, (int)(u8(f) % 4)); break;
        case 21: op_host_write(f); break;
        case 22: check_buffers(f); break;
        case 23: op_event(f); break;
        case 24: op_host_fn(f); break;
        case 25: op_stream_sync(f); break;
        case 26: set_link(f, u8(f)); break;
        case 27: op_pipeline(f); break;
        case 28: op_tracked_round(f); break;
        }
    }
    end(f);
    return 0;
}
