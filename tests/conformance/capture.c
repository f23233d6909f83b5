/* Stream capture (CUDA graphs): every public call that takes or uses a
 * stream, run while the stream is being captured (cuStreamBeginCapture_v2
 * through the driver, in the default global mode), either records graph
 * nodes that do the right thing at each replay (checked over two replays
 * with new inputs between them), or is refused with
 * MAPPING_ERR_UNSUPPORTED naming the call and the capture; either way the
 * capture still ends with a graph (never invalidated behind the caller's
 * back). The table `calls` lists every such call: lint.capture_table
 * (tests/backend/cuda/check_capture_table.cmake) fails when a public
 * function taking a mapping_stream or mapping_event is missing from it.
 * Runs on the CUDA back end (the fake driver in CI); elsewhere SKIP. */
#include "harness.h"

typedef int cu_result_t;

static struct {
    cu_result_t (*cuCtxPushCurrent_v2)(void *ctx);
    cu_result_t (*cuCtxPopCurrent_v2)(void **ctx);
    cu_result_t (*cuStreamBeginCapture_v2)(void *s, int mode);
    cu_result_t (*cuStreamEndCapture)(void *s, void **graph);
    cu_result_t (*cuGraphInstantiateWithFlags)(void **exec, void *graph, unsigned long long flags);
    cu_result_t (*cuGraphLaunch)(void *exec, void *s);
    cu_result_t (*cuGraphExecDestroy)(void *exec);
    cu_result_t (*cuGraphDestroy)(void *graph);
    cu_result_t (*cuStreamCreate)(void **s, unsigned flags);
    cu_result_t (*cuStreamDestroy_v2)(void *s);
    cu_result_t (*cuStreamSynchronize)(void *s);
} cu;

enum { CAPTURE_MODE_GLOBAL = 0, N = 4096 };

/* The CUDA back end and its driver's capture calls; else SKIP. */
static mapping_device *capture_device(void)
{
    if (strcmp(test_backend(), "cuda") != 0)
        test_skip("stream capture is CUDA's (this run is on %s)", test_backend());
    mapping_device *dev = test_device();
    void *lib = test_cuda_driver();
#define CU_LOAD_(name) TEST_CU_LOAD(cu, lib, name);
    CU_LOAD_(cuCtxPushCurrent_v2) CU_LOAD_(cuCtxPopCurrent_v2) CU_LOAD_(cuStreamBeginCapture_v2)
    CU_LOAD_(cuStreamEndCapture) CU_LOAD_(cuGraphInstantiateWithFlags) CU_LOAD_(cuGraphLaunch)
    CU_LOAD_(cuGraphExecDestroy) CU_LOAD_(cuGraphDestroy) CU_LOAD_(cuStreamCreate) CU_LOAD_(cuStreamDestroy_v2)
    CU_LOAD_(cuStreamSynchronize)
#undef CU_LOAD_
    return dev;
}

/* Driver calls of the test itself, in the device's context. */
static void *cu_context(mapping_device *dev)
{
    mapping_native_device native;
    CHECK_OK(mapping_device_native(dev, &native));
    return native.context;
}
#define IN_CTX(ctx, call)                              \
    do {                                               \
        void *popped_;                                 \
        CHECK(cu.cuCtxPushCurrent_v2(ctx) == 0);       \
        CHECK((call) == 0);                            \
        CHECK(cu.cuCtxPopCurrent_v2(&popped_) == 0);   \
    } while (0)

typedef struct cap {
    mapping_device *dev;
    void           *ctx;
    mapping_stream *s, *other; /* s is captured; other is not */
    void           *native;    /* s's CUstream */
    mapping_buffer *a, *b;
    unsigned char  *pinned_in, *pinned_out, *pageable;
    mapping_event  *outside; /* recorded on `other`, outside the capture */
    mapping_batch  *batch;
    mapping_stream *imported;
    mapping_mirror *mirror;
    mapping_multimirror *multi;
    int             host_calls;
} cap;

typedef enum { RECORDED, REFUSED, RUNS_NOW } outcome;

typedef struct call_row {
    const char *fn; /* the public function */
    const char *what;
    outcome     expect;
    mapping_status (*call)(cap *c);
    void (*before_replay)(cap *c, int round); /* RECORDED: new inputs */
    void (*after_replay)(cap *c, int round);  /* RECORDED: what the replay must have done; else
                                                * (round -1) what must hold after the call */
    int         mirror;                       /* a mirror call (its test of its own) */
} call_row;

static void pattern_into(cap *c, mapping_buffer *buf, unsigned seed)
{
    unsigned char tmp[N];
    (void)c;
    test_pattern(tmp, N, seed);
    CHECK_OK(mapping_sync_to_gpu(tmp, buf));
}

static void check_buffer(cap *c, mapping_buffer *buf, unsigned seed)
{
    unsigned char want[N], got[N];
    (void)c;
    test_pattern(want, N, seed);
    CHECK_OK(mapping_sync_to_cpu(buf, got));
    CHECK_BYTES(got, want, N);
}

/* ---- the calls, one function each ---- */
static mapping_status h2d_pinned(cap *c) { return mapping_sync_to_gpu_range(c->s, c->pinned_in, c->a, 0, N); }
static void h2d_before(cap *c, int r) { test_pattern(c->pinned_in, N, 100 + (unsigned)r); }
static void h2d_after(cap *c, int r) { check_buffer(c, c->a, 100 + (unsigned)r); }
static mapping_status h2d_pageable(cap *c) { return mapping_sync_to_gpu_range(c->s, c->pageable, c->a, 0, N); }
static mapping_status d2h_pinned(cap *c) { return mapping_sync_to_cpu_range(c->s, c->a, 0, c->pinned_out, N); }
static void d2h_before(cap *c, int r)
{
    pattern_into(c, c->a, 200 + (unsigned)r);
    memset(c->pinned_out, 0, N);
}
static void d2h_after(cap *c, int r)
{
    unsigned char want[N];
    test_pattern(want, N, 200 + (unsigned)r);
    CHECK_BYTES(c->pinned_out, want, N);
}
static mapping_status d2h_pageable(cap *c) { return mapping_sync_to_cpu_range(c->s, c->a, 0, c->pageable, N); }
static mapping_status copy_gpu(cap *c) { return mapping_copy_gpu(c->s, c->a, 0, c->b, 0, N); }
static void copy_before(cap *c, int r) { pattern_into(c, c->a, 300 + (unsigned)r); }
static void copy_after(cap *c, int r) { check_buffer(c, c->b, 300 + (unsigned)r); }
static mapping_status fill_gpu(cap *c) { return mapping_fill_gpu(c->s, c->b, 0, N, (unsigned char)0x5a); }
static void fill_before(cap *c, int r) { pattern_into(c, c->b, 400 + (unsigned)r); }
static void fill_after(cap *c, int r)
{
    unsigned char want[N], got[N];
    (void)r;
    memset(want, 0x5a, N);
    CHECK_OK(mapping_sync_to_cpu(c->b, got));
    CHECK_BYTES(got, want, N);
}
static void count_call(void *user) { (*(int *)user)++; }
static mapping_status launch_host(cap *c) { return mapping_launch_host(c->s, count_call, &c->host_calls); }
static void host_before(cap *c, int r) { c->host_calls = r; }
static void host_after(cap *c, int r) { CHECK(c->host_calls == r + 1); }

static mapping_status record(cap *c)
{
    mapping_event *e;
    mapping_status st = mapping_event_record(c->s, &e);
    if (st == MAPPING_OK)
        mapping_event_destroy(e);
    return st;
}
static mapping_status wait_same_capture(cap *c)
{
    mapping_event *e;
    mapping_status st = mapping_event_record(c->s, &e);
    if (st == MAPPING_OK) {
        st = mapping_stream_wait_event(c->s, e);
        mapping_event_destroy(e);
    }
    return st;
}
static mapping_status wait_outside(cap *c) { return mapping_stream_wait_event(c->s, c->outside); }
/* The host cannot wait for, query or time a point of a graph. */
static mapping_status on_captured_event(cap *c, int which)
{
    mapping_event *e;
    double seconds;
    CHECK_OK(mapping_event_record(c->s, &e));
    mapping_status st = which == 0 ? mapping_event_synchronize(e) : which == 1 ? mapping_event_query(e)
                                                                               : mapping_event_elapsed(e, e, &seconds);
    mapping_event_destroy(e); /* succeeds: the refusal stays the thread's last error */
    return st;
}
static mapping_status event_sync(cap *c) { return on_captured_event(c, 0); }
static mapping_status event_query(cap *c) { return on_captured_event(c, 1); }
static mapping_status event_elapsed(cap *c) { return on_captured_event(c, 2); }
static mapping_status event_destroy(cap *c)
{
    mapping_event *e;
    CHECK_OK(mapping_event_record(c->s, &e));
    mapping_clear_last_error();
    mapping_event_destroy(e);
    return mapping_last_error();
}
static mapping_status stream_sync(cap *c) { return mapping_stream_synchronize(c->s); }
static mapping_status stream_destroy(cap *c)
{
    mapping_clear_last_error();
    mapping_stream_destroy(c->s); /* refused: the stream stays */
    return mapping_last_error();
}
static mapping_status stream_native(cap *c)
{
    void *n = NULL;
    mapping_status st = mapping_stream_native(c->s, &n);
    CHECK(n == c->native);
    return st;
}
static mapping_status native_stream(cap *c)
{
    void *n = NULL;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    mapping_status st = mapping_native_stream(c->s, &n);
#pragma GCC diagnostic pop
    CHECK(n == c->native);
    return st;
}
static mapping_status stream_create(cap *c)
{
    mapping_stream *s;
    mapping_status st = mapping_stream_create(c->dev, &s);
    if (st == MAPPING_OK)
        mapping_stream_destroy(s);
    return st;
}
static mapping_status import_stream(cap *c) { return mapping_import_stream(c->dev, c->native, &c->imported); }
static mapping_status on_imported(cap *c)
{
    CHECK_OK(mapping_import_stream(c->dev, c->native, &c->imported));
    return mapping_sync_to_gpu_range(c->imported, c->pageable, c->a, 0, N);
}
static mapping_status copy_peer(cap *c) { return mapping_copy_peer(c->s, c->a, 0, c->b, 0, N); }
static mapping_status batch_flush(cap *c) { return mapping_batch_flush(c->s, c->batch); }
static mapping_status wait_native(cap *c) { return mapping_device_wait_native(c->dev, NULL); }
static mapping_status blocking_h2d(cap *c) { return mapping_sync_to_gpu(c->pageable, c->b); }
static mapping_status blocking_d2h(cap *c) { return mapping_sync_to_cpu(c->b, c->pageable); }
static mapping_status step(mapping_stream *s, const mapping_pipeline_chunk *k, void *user)
{
    (void)user;
    return mapping_copy_gpu(s, k->input, k->input_offset, k->output, k->output_offset, k->bytes);
}
static mapping_status pipeline_run(cap *c)
{
    mapping_pipeline *p;
    CHECK_OK(mapping_pipeline_create(c->dev, NULL, &p));
    mapping_status st = mapping_pipeline_run(p, c->pageable, c->pageable, N, step, NULL);
    mapping_pipeline_destroy(p);
    return st;
}
static mapping_status mirror_to_gpu(cap *c)
{
    CHECK_OK(mapping_mirror_mark_cpu_modified(c->mirror, 0, N));
    return mapping_mirror_sync_to_gpu(c->s, c->mirror);
}
static mapping_status mirror_to_cpu(cap *c)
{
    CHECK_OK(mapping_mirror_mark_gpu_modified(c->mirror, 0, N));
    return mapping_mirror_sync_to_cpu(c->s, c->mirror);
}
static mapping_status mirror_acquire(cap *c)
{
    mapping_buffer *buf;
    CHECK_OK(mapping_mirror_mark_cpu_modified(c->mirror, 0, N));
    return mapping_mirror_acquire_gpu(c->s, c->mirror, MAPPING_READ | MAPPING_WRITE, &buf);
}
static mapping_status mirror_release(cap *c) { return mapping_mirror_release_gpu(c->s, c->mirror); }
/* After a refusal: the mirror's state is as before the call (the marked
 * side still stale); a sync outside the capture then moves it. */
static void gpu_still_stale(cap *c, int r)
{
    (void)r;
    CHECK(mapping_mirror_stale_bytes(c->mirror, MAPPING_GPU) == N);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, c->mirror));
}
static void multi_still_stale(cap *c, int r)
{
    (void)r;
    CHECK(mapping_multimirror_stale_bytes(c->multi, 0) == N);
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, c->multi, 0));
}
/* Mirror syncs are recorded as graph syncs: each replay moves what is
 * stale then (tests/conformance/graph_sync.c has the rest). */
static void mirror_cpu_write(cap *c, int r)
{
    test_pattern(mapping_mirror_cpu(c->mirror), N, 500 + (unsigned)r);
    CHECK_OK(mapping_mirror_mark_cpu_modified(c->mirror, 0, N));
}
static void mirror_gpu_has(cap *c, int r)
{
    CHECK(mapping_mirror_stale_bytes(c->mirror, MAPPING_GPU) == 0);
    check_buffer(c, mapping_mirror_gpu(c->mirror), 500 + (unsigned)r);
}
static void mirror_gpu_write(cap *c, int r)
{
    pattern_into(c, mapping_mirror_gpu(c->mirror), 600 + (unsigned)r);
    CHECK_OK(mapping_mirror_mark_gpu_modified(c->mirror, 0, N));
}
static void mirror_cpu_has(cap *c, int r)
{
    unsigned char want[N];
    test_pattern(want, N, 600 + (unsigned)r);
    CHECK(mapping_mirror_stale_bytes(c->mirror, MAPPING_CPU) == 0);
    CHECK_BYTES(mapping_mirror_cpu(c->mirror), want, N);
}
static mapping_status mirror_in_graph(cap *c) { return mapping_mirror_sync_in_graph(c->s, c->mirror, MAPPING_GPU, 8); }
static mapping_status stream_capturing(cap *c)
{
    int on = 0;
    mapping_status st = mapping_stream_capturing(c->s, &on);
    CHECK(on == 1);
    return st;
}
static mapping_status multi_to_gpu(cap *c)
{
    CHECK_OK(mapping_multimirror_mark_cpu_modified(c->multi, 0, N));
    return mapping_multimirror_sync_to_gpu(c->s, c->multi, 0);
}
static mapping_status multi_to_cpu(cap *c) { return mapping_multimirror_sync_to_cpu(c->multi); }

static const call_row calls[] = {
    {"mapping_sync_to_gpu_range", "from page-locked memory", RECORDED, h2d_pinned, h2d_before, h2d_after, 0},
    {"mapping_sync_to_gpu_range", "from pageable memory", REFUSED, h2d_pageable, NULL, NULL, 0},
    {"mapping_sync_to_cpu_range", "into page-locked memory", RECORDED, d2h_pinned, d2h_before, d2h_after, 0},
    {"mapping_sync_to_cpu_range", "into pageable memory", REFUSED, d2h_pageable, NULL, NULL, 0},
    {"mapping_copy_gpu", "", RECORDED, copy_gpu, copy_before, copy_after, 0},
    {"mapping_fill_gpu", "", RECORDED, fill_gpu, fill_before, fill_after, 0},
    {"mapping_launch_host", "", RECORDED, launch_host, host_before, host_after, 0},
    {"mapping_event_record", "", RECORDED, record, NULL, NULL, 0},
    {"mapping_stream_wait_event", "an event of the same capture", RECORDED, wait_same_capture, NULL, NULL, 0},
    {"mapping_stream_wait_event", "an event outside the capture", REFUSED, wait_outside, NULL, NULL, 0},
    {"mapping_event_synchronize", "an event of the capture", REFUSED, event_sync, NULL, NULL, 0},
    {"mapping_event_query", "an event of the capture", REFUSED, event_query, NULL, NULL, 0},
    {"mapping_event_elapsed", "events of the capture", REFUSED, event_elapsed, NULL, NULL, 0},
    {"mapping_event_destroy", "an event of the capture", RUNS_NOW, event_destroy, NULL, NULL, 0},
    {"mapping_stream_synchronize", "", REFUSED, stream_sync, NULL, NULL, 0},
    {"mapping_stream_destroy", "", REFUSED, stream_destroy, NULL, NULL, 0},
    {"mapping_stream_native", "", RUNS_NOW, stream_native, NULL, NULL, 0},
    {"mapping_native_stream", "the deprecated name", RUNS_NOW, native_stream, NULL, NULL, 0},
    {"mapping_stream_create", "another stream, not captured", RUNS_NOW, stream_create, NULL, NULL, 0},
    {"mapping_import_stream", "the capturing CUstream", RUNS_NOW, import_stream, NULL, NULL, 0},
    {"mapping_sync_to_gpu_range", "pageable, on the capturing CUstream imported", REFUSED, on_imported, NULL, NULL, 0},
    {"mapping_copy_peer", "", REFUSED, copy_peer, NULL, NULL, 0},
    {"mapping_batch_flush", "", REFUSED, batch_flush, NULL, NULL, 0},
    {"mapping_device_wait_native", "", REFUSED, wait_native, NULL, NULL, 0},
    {"mapping_sync_to_gpu", "blocking, beside the capture", RUNS_NOW, blocking_h2d, NULL, NULL, 0},
    {"mapping_sync_to_cpu", "blocking, beside the capture", RUNS_NOW, blocking_d2h, NULL, NULL, 0},
    {"mapping_pipeline_run", "its own streams, beside the capture", RUNS_NOW, pipeline_run, NULL, NULL, 0},
    {"mapping_stream_capturing", "", RUNS_NOW, stream_capturing, NULL, NULL, 0},
    {"mapping_mirror_sync_to_gpu", "a graph sync", RECORDED, mirror_to_gpu, mirror_cpu_write, mirror_gpu_has, 1},
    {"mapping_mirror_sync_to_cpu", "a graph sync", RECORDED, mirror_to_cpu, mirror_gpu_write, mirror_cpu_has, 1},
    {"mapping_mirror_sync_in_graph", "", RECORDED, mirror_in_graph, mirror_cpu_write, mirror_gpu_has, 1},
    {"mapping_mirror_acquire_gpu", "", REFUSED, mirror_acquire, NULL, gpu_still_stale, 1},
    {"mapping_mirror_release_gpu", "", REFUSED, mirror_release, NULL, NULL, 1},
    {"mapping_multimirror_sync_to_gpu", "", REFUSED, multi_to_gpu, NULL, multi_still_stale, 1},
    {"mapping_multimirror_sync_to_cpu", "blocking, beside the capture", RUNS_NOW, multi_to_cpu, NULL, NULL, 1},
};

/* ---- running a row ---- */

static void setup(cap *c)
{
    memset(c, 0, sizeof *c);
    c->dev = capture_device();
    c->ctx = cu_context(c->dev);
    CHECK_OK(mapping_stream_create(c->dev, &c->s));
    CHECK_OK(mapping_stream_create(c->dev, &c->other));
    CHECK_OK(mapping_stream_native(c->s, &c->native));
    CHECK_OK(mapping_allocate_gpu(c->dev, N, &c->a));
    CHECK_OK(mapping_allocate_gpu(c->dev, N, &c->b));
    CHECK_OK(mapping_allocate_cpu(c->dev, N, (void **)&c->pinned_in));
    CHECK_OK(mapping_allocate_cpu(c->dev, N, (void **)&c->pinned_out));
    CHECK((c->pageable = malloc(N)) != NULL);
    test_pattern(c->pageable, N, 7);
    CHECK_OK(mapping_event_record(c->other, &c->outside));
    CHECK_OK(mapping_batch_create(c->dev, &c->batch));
    CHECK_OK(mapping_batch_add_to_gpu(c->batch, c->pageable, c->a, 0, 64));
    CHECK_OK(mapping_mirror_create(c->dev, N, 0, &c->mirror));
    CHECK_OK(mapping_multimirror_create(&c->dev, 1, N, &c->multi));
}

static void teardown(cap *c)
{
    CHECK_OK(mapping_stream_synchronize(c->s));
    mapping_multimirror_destroy(c->multi);
    mapping_mirror_destroy(c->mirror);
    mapping_batch_destroy(c->batch);
    mapping_event_destroy(c->outside);
    mapping_free_cpu(c->dev, c->pinned_in);
    mapping_free_cpu(c->dev, c->pinned_out);
    free(c->pageable);
    mapping_free_gpu(c->a);
    mapping_free_gpu(c->b);
    mapping_stream_destroy(c->other);
    mapping_stream_destroy(c->s);
}

/* Two replays of the graph, with new inputs before each. */
static void replay(cap *c, const call_row *row, void *graph)
{
    void *exec = NULL;
    IN_CTX(c->ctx, cu.cuGraphInstantiateWithFlags(&exec, graph, 0));
    for (int round = 0; round < 2; round++) {
        if (row->before_replay)
            row->before_replay(c, round);
        IN_CTX(c->ctx, cu.cuGraphLaunch(exec, c->native));
        CHECK_OK(mapping_stream_synchronize(c->s));
        if (row->after_replay)
            row->after_replay(c, round);
    }
    IN_CTX(c->ctx, cu.cuGraphExecDestroy(exec));
}

static void check_outcome(const call_row *row, mapping_status st, const char *message)
{
    if (row->expect != REFUSED && st != MAPPING_OK)
        test_fail(__FILE__, __LINE__, "%s (%s) under capture returned %s, expected OK: %s", row->fn, row->what,
                  mapping_status_name(st), message);
    if (row->expect == REFUSED &&
        (st != MAPPING_ERR_UNSUPPORTED || !strstr(message, row->fn) || !strstr(message, "captur")))
        test_fail(__FILE__, __LINE__,
                  "%s (%s) under capture returned %s with \"%s\"; expected ERR_UNSUPPORTED naming the call and the "
                  "capture",
                  row->fn, row->what, mapping_status_name(st), message);
}

static void run_row(cap *c, const call_row *row)
{
    mapping_clear_last_error();
    IN_CTX(c->ctx, cu.cuStreamBeginCapture_v2(c->native, CAPTURE_MODE_GLOBAL));
    mapping_status st = row->call(c);
    char message[1024];
    snprintf(message, sizeof message, "%s", mapping_last_error_message());
    void *graph = NULL, *popped;
    CHECK(cu.cuCtxPushCurrent_v2(c->ctx) == 0);
    cu_result_t r = cu.cuStreamEndCapture(c->native, &graph);
    CHECK(cu.cuCtxPopCurrent_v2(&popped) == 0);
    if (r != 0 || !graph)
        test_fail(__FILE__, __LINE__, "%s (%s): the capture ended with CUDA error %d (invalidated behind the "
                  "caller's back); the call returned %s: %s", row->fn, row->what, r, mapping_status_name(st), message);
    check_outcome(row, st, message);
    if (row->expect == RECORDED)
        replay(c, row, graph);
    else if (row->after_replay)
        row->after_replay(c, -1);
    IN_CTX(c->ctx, cu.cuGraphDestroy(graph));
    if (c->imported) {
        mapping_clear_last_error();
        mapping_stream_destroy(c->imported);
        CHECK(mapping_last_error() == MAPPING_OK);
        c->imported = NULL;
    }
}

static void run_rows(int mirrors)
{
    cap c;
    setup(&c);
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++)
        if (calls[i].mirror == mirrors)
            run_row(&c, &calls[i]);
    teardown(&c);
}

TEST(capture_records_or_refuses_every_stream_call)
{
    run_rows(0);
}

/* Mirror syncs are recorded as graph syncs (the state follows each
 * replay); access intents and multimirror syncs would update the state
 * when called, once instead of at each replay: refused. */
TEST(capture_records_mirror_syncs_and_refuses_other_mirror_calls)
{
    run_rows(1);
}

/* A stream created without CU_STREAM_NON_BLOCKING synchronizes with the
 * legacy stream, where blocking calls run: while it is captured they are
 * refused (they would invalidate that capture), and calls on the library's
 * own streams go on. */
TEST(capture_of_a_blocking_stream_refuses_blocking_calls)
{
    cap c;
    setup(&c);
    void *blocking = NULL, *graph = NULL, *popped;
    IN_CTX(c.ctx, cu.cuStreamCreate(&blocking, 0));
    IN_CTX(c.ctx, cu.cuStreamBeginCapture_v2(blocking, CAPTURE_MODE_GLOBAL));
    struct {
        const char    *fn;
        mapping_status st;
    } refused[] = {
        {"mapping_sync_to_gpu", mapping_sync_to_gpu(c.pageable, c.a)},
        {"mapping_sync_to_cpu", mapping_sync_to_cpu(c.a, c.pageable)},
        {"mapping_sync_to_gpu_range", mapping_sync_to_gpu_range(NULL, c.pinned_in, c.a, 0, N)},
        {"mapping_sync_to_cpu_range", mapping_sync_to_cpu_range(NULL, c.a, 0, c.pinned_out, N)},
        {"mapping_copy_gpu", mapping_copy_gpu(NULL, c.a, 0, c.b, 0, N)},
        {"mapping_fill_gpu", mapping_fill_gpu(NULL, c.b, 0, N, 1)},
        {"mapping_batch_flush", mapping_batch_flush(NULL, c.batch)},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        CHECK(refused[i].st == MAPPING_ERR_UNSUPPORTED);
    CHECK(strstr(mapping_last_error_message(), "mapping_batch_flush") != NULL);
    CHECK(strstr(mapping_last_error_message(), "legacy") != NULL);
    /* The library's non-blocking streams are not part of it. */
    CHECK_OK(mapping_sync_to_gpu_range(c.other, c.pinned_in, c.a, 0, N));
    CHECK_OK(mapping_stream_synchronize(c.other));
    CHECK(cu.cuCtxPushCurrent_v2(c.ctx) == 0);
    CHECK(cu.cuStreamEndCapture(blocking, &graph) == 0 && graph != NULL);
    CHECK(cu.cuGraphDestroy(graph) == 0);
    CHECK(cu.cuStreamDestroy_v2(blocking) == 0);
    CHECK(cu.cuCtxPopCurrent_v2(&popped) == 0);
    teardown(&c);
}

/* torch.cuda.graph captures in the global mode, where a thread's unsafe
 * call (an allocation, a synchronize) invalidates another thread's
 * capture: the library's calls must not. */
typedef struct global_capture {
    void           *ctx;
    test_gate       begun, may_end;
    cu_result_t     ended;
} global_capture;

static void *capture_thread(void *arg)
{
    global_capture *g = arg;
    void *s = NULL, *graph = NULL, *popped;
    CHECK(cu.cuCtxPushCurrent_v2(g->ctx) == 0);
    CHECK(cu.cuStreamCreate(&s, 1) == 0);
    CHECK(cu.cuStreamBeginCapture_v2(s, CAPTURE_MODE_GLOBAL) == 0);
    test_gate_open(&g->begun);
    test_gate_wait(&g->may_end);
    g->ended = cu.cuStreamEndCapture(s, &graph);
    if (graph)
        cu.cuGraphDestroy(graph);
    cu.cuStreamDestroy_v2(s);
    cu.cuCtxPopCurrent_v2(&popped);
    return NULL;
}

TEST(capture_in_global_mode_on_another_thread_is_left_alone)
{
    cap c;
    setup(&c);
    global_capture g = {c.ctx, TEST_GATE_INIT, TEST_GATE_INIT, -1};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, capture_thread, &g) == 0);
    test_gate_wait(&g.begun);
    enum { BIG = 4 << 20 }; /* beyond the pools made at open: the driver allocates */
    mapping_buffer *big;
    void *host;
    CHECK_OK(mapping_allocate_gpu(c.dev, BIG, &big));
    CHECK_OK(mapping_allocate_cpu(c.dev, BIG, &host));
    CHECK_OK(mapping_sync_to_gpu(c.pageable, c.a));
    CHECK_OK(mapping_sync_to_gpu_range(c.s, c.pageable, c.a, 0, N));
    CHECK_OK(mapping_stream_synchronize(c.s));
    mapping_event *e;
    CHECK_OK(mapping_event_record(c.s, &e));
    CHECK_OK(mapping_event_synchronize(e));
    mapping_event_destroy(e);
    mapping_free_cpu(c.dev, host);
    mapping_free_gpu(big);
    test_gate_open(&g.may_end);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(g.ended == 0);
    teardown(&c);
}
