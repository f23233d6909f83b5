/*
 * The fault sweep (docs/testing.md). One script of mirror, view, intent,
 * batch, pipeline, stream and event work runs again and again: the n-th run
 * makes the n-th back-end call fail (every fallible one:
 * mapping__inject_fault_any; on the host back end also with slow copies in
 * flight), or the n-th allocation of the library
 * (mapping_os_inject_alloc_fault), for n = 0, 1, 2, ... until a run no
 * longer reaches the fault. After the call that failed:
 * - its status is the injected one (MAPPING_ERR_FAULT_INJECTED, or out of
 *   host or device memory), recorded with a message for mapping_last_error;
 * - the promises of the header hold: a mirror's bytes that it counts as valid
 *   on a side hold the data there, a refused mark changes nothing, a failed
 *   flush leaves each copy done or its destination untouched and exactly the
 *   copies not done queued;
 * - retried without the fault, the call succeeds and the script goes on.
 * At the end of each run every byte the script moved is compared with a
 * model (bytes lost: must be 0) and the device holds no object of the run.
 * A fault that a call handles itself (say, an event it could not record, so
 * it waits instead) is printed as absorbed. The last test fails each
 * allocation of mapping_open in turn.
 */
#include "testing/test_hooks.h"
#include "harness.h"

enum {
    MIRROR_BYTES = 16 << 10,
    RANGES = 17, /* from 16 ranges a sync is batched (on a link of 1 us and more) */
    SMALL = 96,
    N_SMALL = 12,
    LARGE = 64 << 10, /* straight through on the fast link (from 64 KiB) */
    BUF = LARGE + 8192,
    PIPE_BYTES = 256 << 10,
    MAX_RUNS = 4000
};

enum { KIND_BACKEND, KIND_ALLOC };

typedef struct sweep {
    mapping_device *dev;
    int             kind;
    int             failed; /* the run's call that failed (at most one) */
    const char     *failed_call;
    const char     *absorbed_call; /* the call that met the fault and returned OK */
    unsigned long long bytes_checked, bytes_lost;
    /* the script's objects */
    mapping_stream   *s;
    mapping_mirror   *m, *v;
    mapping_batch    *batch;
    mapping_pipeline *pipe;
    struct batch_set *sets;               /* [2] */
    unsigned char     value[MIRROR_BYTES]; /* the mirror's content */
    unsigned char     readback[BUF];
    unsigned char     wrapped[MIRROR_BYTES] __attribute__((aligned(4096)));
    unsigned char     pipe_src[PIPE_BYTES], pipe_dst[PIPE_BYTES];
    unsigned          seed;
} sweep;

static sweep SW; /* large: off the stack */

/* The log: the first error message of the fault (whoever met it). */
static char fault_message[256];
static void keep_fault_message(int level, const char *message, void *user)
{
    (void)user;
    if (level == 0 && !fault_message[0] && (strstr(message, "fault injected") || strstr(message, "out of")))
        snprintf(fault_message, sizeof fault_message, "%s", message);
}

/* -1: no fault armed (or it has fired); else the calls before it. */
static int fault_remaining(const sweep *sw)
{
    return sw->kind == KIND_BACKEND ? mapping__fault_remaining(sw->dev) : (int)mapping_os_alloc_fault_remaining();
}

static int fault_pending(const sweep *sw)
{
    return fault_remaining(sw) >= 0;
}

static void arm(sweep *sw, int n)
{
    if (sw->kind == KIND_BACKEND)
        mapping__inject_fault_any(sw->dev, n);
    else
        mapping_os_inject_alloc_fault(n);
}

/* The checks' own calls do not count: the fault waits for the script. */
static int pause_fault(sweep *sw)
{
    int n = fault_remaining(sw);
    arm(sw, -1);
    return n;
}

static void resume_fault(sweep *sw, int n)
{
    if (n >= 0)
        arm(sw, n);
}

/* A call failed: it must be the injected fault, reported as promised. */
static void on_failure(sweep *sw, mapping_status st, const char *call, int line)
{
    if (fault_pending(sw) || sw->failed)
        test_fail(__FILE__, line, "%s returned %s without an injected fault: %s", call, mapping_status_name(st),
                  mapping_last_error_message());
    sw->failed = line;
    sw->failed_call = call;
    int expected = sw->kind == KIND_BACKEND
                       ? st == MAPPING_ERR_FAULT_INJECTED
                       : st == MAPPING_ERR_OUT_OF_HOST_MEMORY || st == MAPPING_ERR_OUT_OF_DEVICE_MEMORY;
    if (!expected)
        test_fail(__FILE__, line, "%s failed with %s, not the injected fault: %s", call, mapping_status_name(st),
                  mapping_last_error_message());
    if (mapping_last_error() != st || !mapping_last_error_message()[0])
        test_fail(__FILE__, line, "%s failed with %s but recorded %s \"%s\"", call, mapping_status_name(st),
                  mapping_status_name(mapping_last_error()), mapping_last_error_message());
}

static void absorbed_by(sweep *sw, const char *call)
{
    sw->absorbed_call = call;
}

/* Runs `call`; if it fails, checks the failure, runs `after` (the promises
 * of that call), and retries once: the fault has fired, so it must work. */
#define TRY(sw, call, after)                                                                                 \
    do {                                                                                                     \
        mapping_clear_last_error();                                                                          \
        int pending_ = fault_pending(sw);                                                                    \
        mapping_status st_ = (call);                                                                         \
        if (st_ == MAPPING_OK && pending_ && !fault_pending(sw))                                             \
            absorbed_by(sw, #call);                                                                          \
        if (st_ != MAPPING_OK) {                                                                             \
            on_failure(sw, st_, #call, __LINE__);                                                            \
            after;                                                                                           \
            st_ = (call);                                                                                    \
            if (st_ != MAPPING_OK)                                                                           \
                test_fail(__FILE__, __LINE__, "retried without a fault, %s returned %s: %s", #call,         \
                          mapping_status_name(st_), mapping_last_error_message());                          \
        }                                                                                                    \
    } while (0)

/* ---- the promises of a mirror ---- */

/* Every byte the mirror counts as valid on a side holds the model's value
 * there (with `content` 0 only the state is looked at: the caller wrote host
 * bytes whose mark failed). Nothing is stale on both sides. */
static void check_mirror_now(sweep *sw, int content, int line)
{
    CHECK_OK(mapping_stream_synchronize(sw->s));
    mapping_mirror *h = sw->m ? sw->m : sw->v;
    if (!h)
        return;
    mapping_mirror_stale_bytes(h, MAPPING_CPU); /* folds finished copies */
    const mapping_range_set *stale[2] = {mapping__test_mirror_stale(h, MAPPING_CPU),
                                         mapping__test_mirror_stale(h, MAPPING_GPU)};
    if (!mapping__rs_valid(stale[0]) || !mapping__rs_valid(stale[1]))
        test_fail(__FILE__, line, "after %s: a range set is broken", sw->failed_call);
    const unsigned char *cpu = (const unsigned char *)mapping_mirror_cpu(h) - mapping_mirror_gpu_offset(h);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(h), 0, sw->readback, MIRROR_BYTES));
    for (int side = 0; side < 2; side++) {
        mapping_rs_cursor c;
        mapping_range r;
        bool ok = mapping__rs_seek(stale[side], 0, &c, &r);
        for (size_t i = 0; i < MIRROR_BYTES; i++) {
            while (ok && r.hi <= i)
                ok = mapping__rs_next(&c, &r);
            int is_stale = ok && r.lo <= i;
            if (!content || is_stale)
                continue;
            unsigned char got = side ? sw->readback[i] : cpu[i];
            if (got != sw->value[i])
                test_fail(__FILE__, line, "after %s failed: %s byte %zu counts as valid but is 0x%02x, not 0x%02x",
                          sw->failed_call, side ? "GPU" : "CPU", i, got, sw->value[i]);
        }
    }
    sw->bytes_checked += 2 * MIRROR_BYTES;
}

static void check_mirror(sweep *sw, int content, int line)
{
    int paused = pause_fault(sw);
    check_mirror_now(sw, content, line);
    resume_fault(sw, paused);
}

/* A fingerprint of a mirror family's state: its stale and modified ranges
 * on both sides. */
static unsigned long long state_of(mapping_mirror *h)
{
    unsigned long long hash = 1469598103934665603ull;
    for (int side = MAPPING_CPU; side <= MAPPING_GPU; side++) {
        const mapping_range_set *sets[2] = {mapping__test_mirror_stale(h, (mapping_side)side),
                                            mapping__test_mirror_modified(h, (mapping_side)side)};
        for (int k = 0; k < 2; k++) {
            mapping_rs_cursor c;
            mapping_range r;
            for (bool ok = mapping__rs_seek(sets[k], 0, &c, &r); ok; ok = mapping__rs_next(&c, &r))
                hash = (hash ^ (r.lo * 31 + r.hi)) * 1099511628211ull;
            hash = (hash ^ 0xff) * 1099511628211ull;
        }
    }
    return hash;
}

/* Writes new CPU data into RANGES ranges of the view and marks them. */
static void mark_cpu_ranges(sweep *sw, mapping_mirror *h, size_t stride, size_t len)
{
    unsigned char *p = mapping_mirror_cpu(h);
    size_t base = mapping_mirror_gpu_offset(h);
    for (size_t k = 0; k < RANGES; k++) {
        size_t off = k * stride;
        for (size_t i = 0; i < len; i++)
            p[off + i] = sw->value[base + off + i] = (unsigned char)(sw->seed + k * 7 + i);
        unsigned long long before = state_of(h);
        TRY(sw, mapping_mirror_mark_cpu_modified(h, off, len), {
            if (state_of(h) != before)
                test_fail(__FILE__, __LINE__, "a failed mark changed the mirror's state");
            check_mirror(sw, 0, __LINE__);
        });
    }
}

/* Fills RANGES ranges of the view on the device and marks them. */
static void mark_gpu_ranges(sweep *sw, mapping_mirror *h, size_t stride, size_t len)
{
    size_t base = mapping_mirror_gpu_offset(h);
    mapping_buffer *buf = mapping_mirror_gpu(h);
    for (size_t k = 0; k < RANGES; k++) {
        size_t off = k * stride;
        unsigned char val = (unsigned char)(sw->seed * 3 + k);
        TRY(sw, mapping_fill_gpu(NULL, buf, base + off, len, val), check_mirror(sw, 1, __LINE__));
        memset(sw->value + base + off, val, len);
        unsigned long long before = state_of(h);
        TRY(sw, mapping_mirror_mark_gpu_modified(h, off, len), {
            if (state_of(h) != before)
                test_fail(__FILE__, __LINE__, "a failed mark changed the mirror's state");
            check_mirror(sw, 0, __LINE__);
        });
    }
}

/* A sync on the stream, then its completion. Queued work that fails later
 * counts as done (the header): mark the source side again and resync. */
static void sync_on_stream(sweep *sw, mapping_mirror *h, int to_gpu)
{
    if (to_gpu)
        TRY(sw, mapping_mirror_sync_to_gpu(sw->s, h), check_mirror(sw, 1, __LINE__));
    else
        TRY(sw, mapping_mirror_sync_to_cpu(sw->s, h), check_mirror(sw, 1, __LINE__));
    TRY(sw, mapping_stream_synchronize(sw->s), {
        mapping_status (*mark)(mapping_mirror *, size_t, size_t) =
            to_gpu ? mapping_mirror_mark_cpu_modified : mapping_mirror_mark_gpu_modified;
        CHECK_OK(mark(h, 0, mapping_mirror_size(h)));
        CHECK_OK((to_gpu ? mapping_mirror_sync_to_gpu : mapping_mirror_sync_to_cpu)(sw->s, h));
    });
}

static void mirror_work(sweep *sw)
{
    mapping_link slow = {1e-3, 1e9}, fast = {1e-12, 1e9};
    CHECK_OK(mapping_device_set_link(sw->dev, &slow)); /* many ranges: one batch */
    TRY(sw, mapping_mirror_create(sw->dev, MIRROR_BYTES, 0, &sw->m), );
    memset(sw->value, 0, sizeof sw->value);
    TRY(sw, mapping_mirror_view(sw->m, MIRROR_BYTES / 4, MIRROR_BYTES / 2, &sw->v), check_mirror(sw, 1, __LINE__));

    /* The whole mirror written on the CPU (a discard), then synced. */
    unsigned char *p;
    TRY(sw, mapping_mirror_acquire_cpu(sw->m, MAPPING_WRITE, (void **)&p), check_mirror(sw, 1, __LINE__));
    for (size_t i = 0; i < MIRROR_BYTES; i++)
        p[i] = sw->value[i] = (unsigned char)(i * 13 + sw->seed);
    TRY(sw, mapping_mirror_sync_to_gpu(NULL, sw->m), check_mirror(sw, 1, __LINE__));

    /* Many CPU ranges, a blocking batched sync; GPU ranges of the view, a
     * batched sync back on the stream. */
    mark_cpu_ranges(sw, sw->m, MIRROR_BYTES / RANGES, 100);
    TRY(sw, mapping_mirror_sync_to_gpu(NULL, sw->m), check_mirror(sw, 1, __LINE__));
    mark_gpu_ranges(sw, sw->v, MIRROR_BYTES / 2 / RANGES, 40);
    sync_on_stream(sw, sw->m, 0);

    /* Device work through the intents, on the stream. */
    mapping_buffer *buf;
    TRY(sw, mapping_mirror_acquire_gpu(sw->s, sw->v, MAPPING_READ | MAPPING_WRITE, &buf),
        check_mirror(sw, 1, __LINE__));
    size_t at = mapping_mirror_gpu_offset(sw->v) + 1000;
    TRY(sw, mapping_fill_gpu(sw->s, buf, at, 3000, 0x5a), );
    memset(sw->value + at, 0x5a, 3000);
    TRY(sw, mapping_mirror_release_gpu(sw->s, sw->v), );
    TRY(sw, mapping_mirror_acquire_cpu(sw->m, MAPPING_READ, (void **)&p), check_mirror(sw, 1, __LINE__));

    /* Fewer ranges on a fast link: one copy each, on the stream. */
    CHECK_OK(mapping_device_set_link(sw->dev, &fast));
    mark_cpu_ranges(sw, sw->v, MIRROR_BYTES / 2 / RANGES, 64);
    sync_on_stream(sw, sw->v, 1);
    mark_gpu_ranges(sw, sw->m, MIRROR_BYTES / RANGES, 200);
    TRY(sw, mapping_mirror_sync_to_cpu(NULL, sw->m), check_mirror(sw, 1, __LINE__));

    /* Everything valid on both sides, as the model says. */
    int paused = pause_fault(sw);
    check_mirror_now(sw, 1, __LINE__);
    if (mapping_mirror_stale_bytes(sw->m, MAPPING_CPU) || mapping_mirror_stale_bytes(sw->m, MAPPING_GPU))
        test_fail(__FILE__, __LINE__, "stale bytes remain after both syncs");
    const unsigned char *cpu = mapping_mirror_cpu(sw->m);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(sw->m), 0, sw->readback, MIRROR_BYTES));
    for (size_t i = 0; i < MIRROR_BYTES; i++)
        sw->bytes_lost += (cpu[i] != sw->value[i]) + (sw->readback[i] != sw->value[i]);
    sw->bytes_checked += 2 * MIRROR_BYTES;
    resume_fault(sw, paused);

    /* Destroyed with a copy still queued: the memory goes after the copy. */
    TRY(sw, mapping_mirror_mark_cpu_modified(sw->m, 0, MIRROR_BYTES), check_mirror(sw, 1, __LINE__));
    TRY(sw, mapping_mirror_sync_to_gpu(sw->s, sw->m), check_mirror(sw, 1, __LINE__));
    mapping_mirror_destroy(sw->v);
    mapping_mirror_destroy(sw->m);
    sw->m = sw->v = NULL;
}

/* ---- batches ---- */

typedef struct copy_spec {
    int    to_gpu;
    size_t dev_off, host_off, bytes;
} copy_spec;

static size_t batch_plan_copies(copy_spec *c)
{
    size_t n = 0;
    for (size_t i = 0; i < N_SMALL; i++)
        c[n++] = (copy_spec){1, i * 2 * SMALL, i * SMALL, SMALL};
    c[n++] = (copy_spec){1, BUF - LARGE, BUF - LARGE, LARGE};
    for (size_t i = 0; i < N_SMALL; i++)
        c[n++] = (copy_spec){0, i * 3 * SMALL, i * SMALL, SMALL};
    c[n++] = (copy_spec){0, BUF - LARGE, BUF - LARGE, LARGE};
    return n;
}

/* One set of a batch's buffers and host arrays: two flushes in a row use
 * two sets, so the second can start while the first is still queued. */
typedef struct batch_set {
    mapping_buffer *dst_buf, *src_buf;
    unsigned char   h2d_src[BUF], d2h_dst[BUF], device_content[BUF];
    unsigned char   old_device, old_host;
} batch_set;

static batch_set SETS[2];

/* 1: the copy is done; 0: its destination is untouched (else the test fails). */
static int copy_done(sweep *sw, batch_set *b, const copy_spec *c)
{
    const unsigned char *got, *want;
    unsigned char old;
    if (c->to_gpu) {
        CHECK_OK(mapping_sync_to_cpu_range(NULL, b->dst_buf, c->dev_off, sw->readback, c->bytes));
        got = sw->readback, want = b->h2d_src + c->host_off, old = b->old_device;
    } else {
        got = b->d2h_dst + c->host_off, want = b->device_content + c->dev_off, old = b->old_host;
    }
    if (!memcmp(got, want, c->bytes))
        return 1;
    for (size_t i = 0; i < c->bytes; i++)
        if (got[i] != old)
            test_fail(__FILE__, __LINE__, "after %s failed: a %s copy of %zu bytes is neither done nor untouched "
                      "(byte %zu is 0x%02x)", sw->failed_call, c->to_gpu ? "host-to-device" : "device-to-host",
                      c->bytes, i, got[i]);
    return 0;
}

/* After a failed flush (the fault has fired: nothing to pause). */
static void check_failed_flush(sweep *sw, batch_set *b, const copy_spec *c, size_t n)
{
    /* A blocking flush whose single wait failed cannot tell what completed:
     * all stay queued (each destination old or copied: copy_done checks). */
    bool unknown = strstr(mapping_last_error_message(), "which copies completed is unknown") != NULL;
    CHECK_OK(mapping_stream_synchronize(sw->s));
    size_t not_done = 0;
    for (size_t i = 0; i < n; i++)
        not_done += !copy_done(sw, b, &c[i]);
    if (unknown)
        not_done = n;
    if (mapping_batch_count(sw->batch) != not_done)
        test_fail(__FILE__, __LINE__, "after a failed flush %zu copies are queued, %zu were not done",
                  mapping_batch_count(sw->batch), not_done);
}

static copy_spec copies[2 * N_SMALL + 2];
static size_t    n_copies;

/* Sets the set's starting content, queues its copies and flushes them;
 * on a stream it does not wait. */
static void batch_flush_set(sweep *sw, batch_set *b, unsigned salt, mapping_stream *s)
{
    n_copies = batch_plan_copies(copies);
    b->old_device = (unsigned char)(0x11 + salt);
    b->old_host = (unsigned char)(0x22 + salt);
    test_pattern(b->h2d_src, BUF, sw->seed + 10 + salt);
    test_pattern(b->device_content, BUF, sw->seed + 20 + salt);
    TRY(sw, mapping_fill_gpu(NULL, b->dst_buf, 0, BUF, b->old_device), );
    TRY(sw, mapping_sync_to_gpu(b->device_content, b->src_buf), );
    memset(b->d2h_dst, b->old_host, BUF);
    for (size_t i = 0; i < n_copies; i++) {
        const copy_spec *c = &copies[i];
        size_t before = mapping_batch_count(sw->batch);
        if (c->to_gpu)
            TRY(sw, mapping_batch_add_to_gpu(sw->batch, b->h2d_src + c->host_off, b->dst_buf, c->dev_off, c->bytes),
                CHECK(mapping_batch_count(sw->batch) == before));
        else
            TRY(sw, mapping_batch_add_to_cpu(sw->batch, b->src_buf, c->dev_off, b->d2h_dst + c->host_off, c->bytes),
                CHECK(mapping_batch_count(sw->batch) == before));
    }
    TRY(sw, mapping_batch_flush(s, sw->batch), check_failed_flush(sw, b, copies, n_copies));
    CHECK(mapping_batch_count(sw->batch) == 0);
}

/* Every copy of the set done (after the stream is synchronized). */
static void batch_verify_set(sweep *sw, batch_set *b)
{
    int paused = pause_fault(sw);
    for (size_t i = 0; i < n_copies; i++) {
        const copy_spec *c = &copies[i];
        const unsigned char *got, *want;
        if (c->to_gpu) {
            CHECK_OK(mapping_sync_to_cpu_range(NULL, b->dst_buf, c->dev_off, sw->readback, c->bytes));
            got = sw->readback, want = b->h2d_src + c->host_off;
        } else {
            got = b->d2h_dst + c->host_off, want = b->device_content + c->dev_off;
        }
        for (size_t k = 0; k < c->bytes; k++)
            sw->bytes_lost += got[k] != want[k];
        sw->bytes_checked += c->bytes;
    }
    resume_fault(sw, paused);
}

/* A flush on the stream, then at once a blocking flush of the same batch
 * (which must first wait for the first: it reuses the staging memory). */
static void batch_work(sweep *sw)
{
    batch_flush_set(sw, &sw->sets[0], 0, sw->s);
    batch_flush_set(sw, &sw->sets[1], 1, NULL);
    TRY(sw, mapping_stream_synchronize(sw->s), );
    batch_verify_set(sw, &sw->sets[0]);
    batch_verify_set(sw, &sw->sets[1]);
}

/* ---- pipelines ---- */

static mapping_status copy_step(mapping_stream *stream, const mapping_pipeline_chunk *c, void *user)
{
    (void)user;
    return mapping_copy_gpu(stream, c->input, c->input_offset, c->output, c->output_offset, c->bytes);
}

static void pipeline_work(sweep *sw)
{
    mapping_pipeline_desc desc = {.chunk_bytes = 64 << 10, .depth = 2};
    TRY(sw, mapping_pipeline_create(sw->dev, &desc, &sw->pipe), );
    test_pattern(sw->pipe_src, PIPE_BYTES, sw->seed + 30);
    memset(sw->pipe_dst, 0, PIPE_BYTES);
    TRY(sw, mapping_pipeline_run(sw->pipe, sw->pipe_src, sw->pipe_dst, PIPE_BYTES, copy_step, NULL), );
    for (size_t i = 0; i < PIPE_BYTES; i++)
        sw->bytes_lost += sw->pipe_dst[i] != sw->pipe_src[i];
    sw->bytes_checked += PIPE_BYTES;
    mapping_pipeline_destroy(sw->pipe);
    sw->pipe = NULL;
}

/* ---- unified and wrapped mirrors, host memory, host functions, events ---- */

static void count_call(void *counter)
{
    (*(int *)counter)++;
}

static void other_work(sweep *sw)
{
    /* A unified mirror (syncs are prefetches or nothing). */
    mapping_mirror *u;
    unsigned char *p;
    mapping_buffer *buf;
    TRY(sw, mapping_mirror_create(sw->dev, MIRROR_BYTES, MAPPING_MIRROR_UNIFIED, &u), );
    TRY(sw, mapping_mirror_acquire_cpu(u, MAPPING_WRITE, (void **)&p), );
    test_pattern(sw->value, MIRROR_BYTES, sw->seed + 40);
    memcpy(p, sw->value, MIRROR_BYTES);
    TRY(sw, mapping_mirror_sync_to_gpu(sw->s, u), );
    TRY(sw, mapping_mirror_acquire_gpu(sw->s, u, MAPPING_READ | MAPPING_WRITE, &buf), );
    TRY(sw, mapping_fill_gpu(sw->s, buf, mapping_mirror_gpu_offset(u) + 100, 500, 0x77), );
    memset(sw->value + 100, 0x77, 500);
    TRY(sw, mapping_mirror_release_gpu(sw->s, u), );
    TRY(sw, mapping_mirror_acquire_cpu(u, MAPPING_READ, (void **)&p), );
    for (size_t i = 0; i < MIRROR_BYTES; i++)
        sw->bytes_lost += p[i] != sw->value[i];
    sw->bytes_checked += MIRROR_BYTES;
    mapping_mirror_destroy(u);

    /* The caller's memory, page-locked in place where the back end can. */
    mapping_mirror *w;
    test_pattern(sw->wrapped, MIRROR_BYTES, sw->seed + 50);
    TRY(sw, mapping_mirror_wrap(sw->dev, sw->wrapped, MIRROR_BYTES, MAPPING_MIRROR_PIN, &w), );
    TRY(sw, mapping_mirror_sync_to_gpu(NULL, w), );
    int paused = pause_fault(sw);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(w), 0, sw->readback, MIRROR_BYTES));
    for (size_t i = 0; i < MIRROR_BYTES; i++)
        sw->bytes_lost += sw->readback[i] != sw->wrapped[i];
    sw->bytes_checked += MIRROR_BYTES;
    resume_fault(sw, paused);
    mapping_mirror_destroy(w);

    /* Page-locked memory, a host function, events joining two streams. */
    void *host;
    mapping_stream *s2;
    mapping_event *ev;
    int calls = 0;
    TRY(sw, mapping_allocate_cpu(sw->dev, 4096, &host), );
    TRY(sw, mapping_stream_create(sw->dev, &s2), );
    TRY(sw, mapping_launch_host(sw->s, count_call, &calls), );
    TRY(sw, mapping_event_record(sw->s, &ev), );
    TRY(sw, mapping_stream_wait_event(s2, ev), );
    TRY(sw, mapping_sync_to_gpu_range(s2, host, sw->sets[0].dst_buf, 0, 4096), );
    TRY(sw, mapping_event_synchronize(ev), );
    TRY(sw, mapping_stream_synchronize(s2), );
    if (calls != 1)
        test_fail(__FILE__, __LINE__, "after %s failed: the host function ran %d times", sw->failed_call, calls);
    mapping_event_destroy(ev);
    mapping_stream_destroy(s2);
    mapping_free_cpu(sw->dev, host);
}

/* ---- one run ---- */

static int list_empty(const mapping_list_node *head)
{
    return head->next == head || head->next == NULL;
}

static void run_script(sweep *sw)
{
    mapping_clear_last_error();
    sw->failed = 0;
    sw->failed_call = "nothing";
    sw->absorbed_call = NULL;
    TRY(sw, mapping_stream_create(sw->dev, &sw->s), );
    for (int i = 0; i < 2; i++) {
        TRY(sw, mapping_allocate_gpu(sw->dev, BUF, &sw->sets[i].dst_buf), );
        TRY(sw, mapping_allocate_gpu(sw->dev, BUF, &sw->sets[i].src_buf), );
    }
    mirror_work(sw);
    TRY(sw, mapping_batch_create(sw->dev, &sw->batch), );
    batch_work(sw);
    mapping_batch_destroy(sw->batch);
    pipeline_work(sw);
    other_work(sw);
    for (int i = 0; i < 2; i++) {
        mapping_free_gpu(sw->sets[i].dst_buf);
        mapping_free_gpu(sw->sets[i].src_buf);
    }
    mapping_stream_destroy(sw->s);
    if (!list_empty(&sw->dev->buffers) || !list_empty(&sw->dev->streams) || !list_empty(&sw->dev->events) ||
        sw->dev->host_blocks.count != 0)
        test_fail(__FILE__, __LINE__, "after %s failed, the device still holds objects of the run",
                  sw->failed_call);
}

static void sweep_faults(int kind)
{
    sweep *sw = &SW;
    memset(sw, 0, sizeof *sw);
    sw->sets = SETS;
    sw->dev = test_device();
    sw->kind = kind;
    mapping_set_log(keep_fault_message, NULL);
    const char *what = kind == KIND_BACKEND ? "back-end call" : "allocation";
    unsigned long long injected = 0, absorbed = 0;
    int n;
    for (n = 0; n < MAX_RUNS; n++) {
        sw->seed = (unsigned)n;
        fault_message[0] = '\0';
        arm(sw, n);
        run_script(sw);
        int fired = !fault_pending(sw);
        arm(sw, -1);
        if (!fired)
            break;
        injected++;
        if (getenv("MAPPING_TEST_VERBOSE"))
            printf("%s %d: %s failed at line %d\n", what, n, sw->failed_call, sw->failed);
        if (!sw->failed) { /* handled inside the library (a fallback), or by a call without a status */
            absorbed++;
            printf("%s %d: no call failed; %s returned OK (the fault: %s)\n", what, n,
                   sw->absorbed_call ? sw->absorbed_call : "a call without a status", fault_message);
        }
        if (sw->bytes_lost)
            test_fail(__FILE__, __LINE__, "failing %s %d (%s): %llu bytes lost", what, n, sw->failed_call,
                      sw->bytes_lost);
    }
    CHECK(n < MAX_RUNS);
    CHECK(injected > 10);
    printf("%s sweep on %s: %llu faults injected (%llu absorbed by the library), a clean run after %d; "
           "%llu bytes checked, %llu bytes lost\n",
           what, test_backend(), injected, absorbed, n, sw->bytes_checked, sw->bytes_lost);
}

TEST(fault_sweep_fails_each_backend_call_and_loses_no_byte)
{
    sweep_faults(KIND_BACKEND);
}

TEST(fault_sweep_fails_each_allocation_and_loses_no_byte)
{
    sweep_faults(KIND_ALLOC);
}

/* On the host back end copies finish nearly at once, so a failed wait rarely
 * meets work still running. A modelled link (50 us + 2 GB/s per copy) keeps
 * queued work in flight when the waits fail. */
TEST(fault_sweep_with_slow_copies_in_flight)
{
    if (strcmp(test_backend(), "host") != 0)
        test_skip("the modelled link is a host back end feature");
    setenv("MAPPING_HOST_LINK", "2e9,50e-6", 1);
    sweep_faults(KIND_BACKEND);
}

/* Opening and closing a device, with the n-th allocation failing: a failed
 * open reports out of memory and leaves nothing behind (the sanitizer build
 * checks for leaks); a device that opened works and closes. */
TEST(fault_sweep_open_fails_cleanly_at_each_allocation)
{
    test_device(); /* SKIP where the back end is absent; loads it once */
    mapping_device_desc desc = {.backend = test_backend()};
    int n, failures = 0;
    for (n = 0; n < 1000; n++) {
        mapping_device *dev = NULL;
        mapping_os_inject_alloc_fault(n);
        mapping_clear_last_error();
        mapping_status st = mapping_open(&desc, &dev);
        int fired = mapping_os_alloc_fault_remaining() < 0;
        mapping_os_inject_alloc_fault(-1);
        if (st != MAPPING_OK) {
            if (!fired)
                test_fail(__FILE__, __LINE__, "mapping_open failed without an injected fault: %s",
                          mapping_last_error_message());
            CHECK(st == MAPPING_ERR_OUT_OF_HOST_MEMORY || st == MAPPING_ERR_OUT_OF_DEVICE_MEMORY);
            CHECK(mapping_last_error() == st && mapping_last_error_message()[0]);
            CHECK(dev == NULL);
            failures++;
            continue;
        }
        mapping_buffer *buf;
        unsigned char in[256], out[256];
        test_pattern(in, sizeof in, (unsigned)n);
        CHECK_OK(mapping_allocate_gpu(dev, sizeof in, &buf));
        CHECK_OK(mapping_sync_to_gpu(in, buf));
        CHECK_OK(mapping_sync_to_cpu(buf, out));
        CHECK_BYTES(out, in, sizeof in);
        mapping_free_gpu(buf);
        mapping_close(dev);
        if (!fired)
            break;
    }
    CHECK(n < 1000);
    printf("mapping_open on %s: %d allocations failed in turn, %d opens refused, then a clean open\n",
           test_backend(), n, failures);
}
