/* Mirror syncs recorded in a CUDA graph (mapping_mirror_sync_in_graph, and
 * mapping_mirror_sync_to_gpu / _to_cpu on a capturing stream): each replay
 * moves exactly what is stale at that replay, in either direction, and the
 * mirror's state follows the replay; nothing moves when nothing is stale;
 * the table's overflow joins ranges or leaves the rest stale; the graph
 * keeps its family alive; bad input is refused. On the CUDA back end (the
 * fake driver in CI); elsewhere the call is refused as UNSUPPORTED. */
#include "harness.h"
#include <dlfcn.h>
#include <stdbool.h>

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
    long long (*fake_cuda_count)(const char *name); /* the fake driver's counters, where it is the fake */
} cu;

enum { N = 64 << 10 };

typedef struct graph_run {
    mapping_device *dev;
    void           *ctx;
    mapping_stream *s;
    void           *native;
    void           *graph, *exec;
} graph_run;

/* The CUDA back end and its driver's graph calls; else SKIP. */
static void graph_setup(graph_run *g)
{
    memset(g, 0, sizeof *g);
    if (strcmp(test_backend(), "cuda") != 0)
        test_skip("CUDA graphs are CUDA's (this run is on %s)", test_backend());
    g->dev = test_device();
    void *lib = test_cuda_driver();
#define CU_LOAD_(name) TEST_CU_LOAD(cu, lib, name);
    CU_LOAD_(cuCtxPushCurrent_v2) CU_LOAD_(cuCtxPopCurrent_v2) CU_LOAD_(cuStreamBeginCapture_v2)
    CU_LOAD_(cuStreamEndCapture) CU_LOAD_(cuGraphInstantiateWithFlags) CU_LOAD_(cuGraphLaunch)
    CU_LOAD_(cuGraphExecDestroy) CU_LOAD_(cuGraphDestroy)
#undef CU_LOAD_
    void *count = dlsym(lib, "fake_cuda_count");
    memcpy(&cu.fake_cuda_count, &count, sizeof count);
    mapping_native_device native;
    CHECK_OK(mapping_device_native(g->dev, &native));
    g->ctx = native.context;
    CHECK_OK(mapping_stream_create(g->dev, &g->s));
    CHECK_OK(mapping_stream_native(g->s, &g->native));
}

#define IN_CTX(ctx, call)                              \
    do {                                               \
        void *popped_;                                 \
        CHECK(cu.cuCtxPushCurrent_v2(ctx) == 0);       \
        CHECK((call) == 0);                            \
        CHECK(cu.cuCtxPopCurrent_v2(&popped_) == 0);   \
    } while (0)

static void begin(graph_run *g)
{
    IN_CTX(g->ctx, cu.cuStreamBeginCapture_v2(g->native, 0));
    int capturing = 0;
    CHECK_OK(mapping_stream_capturing(g->s, &capturing));
    CHECK(capturing == 1);
}

static void end(graph_run *g)
{
    IN_CTX(g->ctx, cu.cuStreamEndCapture(g->native, &g->graph));
    IN_CTX(g->ctx, cu.cuGraphInstantiateWithFlags(&g->exec, g->graph, 0));
    int capturing = 1;
    CHECK_OK(mapping_stream_capturing(g->s, &capturing));
    CHECK(capturing == 0);
}

static void replay(graph_run *g)
{
    IN_CTX(g->ctx, cu.cuGraphLaunch(g->exec, g->native));
    CHECK_OK(mapping_stream_synchronize(g->s));
}

static void graph_destroy(graph_run *g)
{
    if (g->exec)
        IN_CTX(g->ctx, cu.cuGraphExecDestroy(g->exec));
    if (g->graph)
        IN_CTX(g->ctx, cu.cuGraphDestroy(g->graph));
    g->exec = g->graph = NULL;
}

static void teardown(graph_run *g)
{
    graph_destroy(g);
    mapping_stream_destroy(g->s);
}

static long long fake_count(const char *name)
{
    return cu.fake_cuda_count ? cu.fake_cuda_count(name) : -1;
}

/* ---- the model: both sides' expected bytes and where each is stale ---- */

typedef struct model {
    unsigned char want[N];
    unsigned char cpu_stale[N], gpu_stale[N];
} model;

static bool any(const unsigned char *flags, size_t a, size_t b)
{
    for (size_t i = a; i < b; i++)
        if (flags[i])
            return true;
    return false;
}

static size_t count_in(const unsigned char *flags, size_t a, size_t b)
{
    size_t n = 0;
    for (size_t i = a; i < b; i++)
        n += flags[i];
    return n;
}

/* A random write of one side where the other holds no unsynced write. */
static void random_mark(mapping_mirror *m, model *md, unsigned long long *rng)
{
    size_t a = (size_t)(test_xorshift64(rng) % N), len = 1 + (size_t)(test_xorshift64(rng) % 3000);
    size_t b = a + len > N ? N : a + len;
    bool cpu = test_xorshift64(rng) & 1;
    if (any(cpu ? md->cpu_stale : md->gpu_stale, a, b))
        return; /* the other side's unsynced write there: a conflict */
    unsigned char bytes[3000];
    test_pattern(bytes, b - a, (unsigned)test_xorshift64(rng));
    memcpy(md->want + a, bytes, b - a);
    if (cpu) {
        memcpy((unsigned char *)mapping_mirror_cpu(m) + a, bytes, b - a);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, a, b - a));
    } else {
        CHECK_OK(mapping_sync_to_gpu_range(NULL, bytes, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m) + a, b - a));
        CHECK_OK(mapping_mirror_mark_gpu_modified(m, a, b - a));
    }
    memset((cpu ? md->gpu_stale : md->cpu_stale) + a, 1, b - a);
}

static void check_sides(mapping_mirror *m, const model *md)
{
    static unsigned char gpu[N];
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), gpu, N));
    CHECK_BYTES(mapping_mirror_cpu(m), md->want, N);
    CHECK_BYTES(gpu, md->want, N);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
}

/* A graph of [sync to the GPU, sync to the CPU] replayed 40 times with
 * random marks of both sides before each: after each replay both sides
 * equal the model, and the bytes moved each way are the bytes stale then
 * (no gap merged: a table entry costs no transfer). A replay with nothing
 * stale moves nothing. */
TEST(graph_sync_replays_move_exactly_the_bytes_stale_at_each_replay)
{
    graph_run g;
    graph_setup(&g);
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(g.dev, N, 0, &m));
    static model md;
    memset(&md, 0, sizeof md);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    begin(&g);
    CHECK_OK(mapping_mirror_sync_to_gpu(g.s, m));
    CHECK_OK(mapping_mirror_sync_in_graph(g.s, m, MAPPING_CPU, 0));
    end(&g);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0); /* nothing ran at capture */
    unsigned long long rng = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < 40; round++) {
        int marks = round % 5 == 4 ? 0 : 1 + (int)(test_xorshift64(&rng) % 12);
        for (int i = 0; i < marks; i++)
            random_mark(m, &md, &rng);
        size_t up = count_in(md.gpu_stale, 0, N), down = count_in(md.cpu_stale, 0, N);
        long long empty = fake_count("table_copies_empty");
        mapping_stats before = test_stats(g.dev);
        replay(&g);
        mapping_stats after = test_stats(g.dev);
        CHECK(after.h2d_payload_bytes - before.h2d_payload_bytes == up);
        CHECK(after.h2d_bytes - before.h2d_bytes == up);
        CHECK(after.d2h_payload_bytes - before.d2h_payload_bytes == down);
        CHECK(after.d2h_bytes - before.d2h_bytes == down);
        CHECK(after.graph_sync_runs - before.graph_sync_runs == 2);
        CHECK(after.graph_sync_overflows == before.graph_sync_overflows);
        if (marks == 0 && empty >= 0)
            CHECK(fake_count("table_copies_empty") - empty == 2); /* the kernel read a count of 0, twice */
        memset(md.cpu_stale, 0, N);
        memset(md.gpu_stale, 0, N);
        check_sides(m, &md);
    }
    graph_destroy(&g);
    mapping_mirror_destroy(m);
    teardown(&g);
}

/* A view's graph sync moves the view's stale bytes only; the rest of the
 * family stays as it was. Recorded on a wrapped page-locked mirror
 * (MAPPING_MIRROR_PIN), whose device address differs from the host's. */
TEST(graph_sync_of_a_view_moves_the_view_only)
{
    graph_run g;
    graph_setup(&g);
    unsigned char *cpu = aligned_alloc(4096, N);
    CHECK(cpu != NULL);
    test_pattern(cpu, N, 3);
    mapping_mirror *m, *view;
    CHECK_OK(mapping_mirror_wrap(g.dev, cpu, N, MAPPING_MIRROR_PIN, &m));
    if (!mapping_mirror_is_pinned(m))
        test_skip("the wrap could not be page-locked");
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK_OK(mapping_mirror_view(m, 4096, 8192, &view));
    begin(&g);
    CHECK_OK(mapping_mirror_sync_in_graph(g.s, view, MAPPING_GPU, 16));
    end(&g);
    for (int round = 0; round < 3; round++) {
        memset(cpu, 0x40 + round, N);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, N));
        replay(&g);
        CHECK(mapping_mirror_stale_bytes(view, MAPPING_GPU) == 0);
        CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == N - 8192);
        unsigned char got[N], want[8192];
        CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), 0, got, N));
        memset(want, 0x40 + round, sizeof want);
        CHECK_BYTES(got + 4096, want, sizeof want);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    }
    graph_destroy(&g);
    mapping_mirror_destroy(view);
    mapping_mirror_destroy(m);
    free(cpu);
    teardown(&g);
}

/* More stale ranges than the table holds: joined over gaps valid on both
 * sides (the bytes moved exceed the stale ones, which all arrive); where
 * the gaps are the other side's unsynced writes they cannot be joined, and
 * what does not fit stays stale (counted), moved by the next sync. */
TEST(graph_sync_table_overflow_joins_ranges_or_leaves_the_rest_stale)
{
    graph_run g;
    graph_setup(&g);
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(g.dev, N, 0, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    begin(&g);
    CHECK_OK(mapping_mirror_sync_in_graph(g.s, m, MAPPING_GPU, 4));
    end(&g);
    unsigned char *cpu = mapping_mirror_cpu(m);
    for (size_t i = 0; i < 10; i++) { /* 10 ranges of 100 B, 1,000 B apart */
        memset(cpu + i * 1100, (int)(i + 1), 100);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, i * 1100, 100));
    }
    mapping_stats before = test_stats(g.dev);
    replay(&g);
    mapping_stats after = test_stats(g.dev);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    CHECK(after.h2d_payload_bytes - before.h2d_payload_bytes == 1000);
    CHECK(after.h2d_bytes - before.h2d_bytes > 1000);
    CHECK(after.graph_sync_overflows == before.graph_sync_overflows);
    test_check_mirror_sides_equal(m);
    /* Now the gaps are the GPU's writes: 10 CPU ranges cannot become 4. */
    for (size_t i = 0; i < 10; i++) {
        memset(cpu + i * 1100, (int)(i + 20), 100);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, i * 1100, 100));
        CHECK_OK(mapping_mirror_mark_gpu_modified(m, i * 1100 + 500, 10));
    }
    before = test_stats(g.dev);
    replay(&g);
    after = test_stats(g.dev);
    CHECK(after.graph_sync_overflows - before.graph_sync_overflows == 1);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 600); /* 4 ranges moved, 6 stay stale */
    unsigned char got[N];
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), 0, got, N));
    for (size_t i = 0; i < 10; i++) /* the first 4 arrived, whole; the rest did not */
        for (size_t b = 0; b < 100; b++)
            CHECK(got[i * 1100 + b] == (i < 4 ? i + 20 : i + 1));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    test_check_mirror_sides_equal(m);
    graph_destroy(&g);
    mapping_mirror_destroy(m);
    teardown(&g);
}

/* The graph holds its family: destroying the mirror while the graph exists
 * leaves replays working (the memory stays); destroying the graph and its
 * executable lets the family go (freed at the next mirror call, not left to
 * mapping_close). A graph whose capture was abandoned lets go too. */
TEST(graph_sync_keeps_its_mirror_alive_until_the_graph_is_gone)
{
    graph_run g;
    graph_setup(&g);
    mapping_mirror *m, *other;
    CHECK_OK(mapping_mirror_create(g.dev, N, 0, &m));
    memset(mapping_mirror_cpu(m), 7, N);
    begin(&g);
    CHECK_OK(mapping_mirror_sync_to_gpu(g.s, m));
    end(&g);
    mapping_buffer *gpu = mapping_mirror_gpu(m);
    mapping_mirror_destroy(m); /* the graph still holds the family */
    replay(&g);                /* moves the stale GPU side */
    unsigned char got[N], want[N];
    memset(want, 7, N);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, gpu, 0, got, N));
    CHECK_BYTES(got, want, N);
    replay(&g); /* nothing stale: moves nothing */
    long long gone = fake_count("user_objects_destroyed");
    graph_destroy(&g);
    if (gone >= 0)
        CHECK(fake_count("user_objects_destroyed") == gone + 1);
    void *native = NULL;
    CHECK_OK(mapping_buffer_native(gpu, &native)); /* still the family's */
    CHECK_OK(mapping_mirror_create(g.dev, 64, 0, &other)); /* frees what the graph let go */
    CHECK(mapping_buffer_native(gpu, &native) == MAPPING_ERR_INVALID_HANDLE);
    mapping_mirror_destroy(other);
    /* A graph destroyed without ever being instantiated lets go as well. */
    CHECK_OK(mapping_mirror_create(g.dev, N, 0, &m));
    gpu = mapping_mirror_gpu(m);
    begin(&g);
    CHECK_OK(mapping_mirror_sync_to_gpu(g.s, m));
    void *graph = NULL, *popped;
    CHECK(cu.cuCtxPushCurrent_v2(g.ctx) == 0);
    CHECK(cu.cuStreamEndCapture(g.native, &graph) == 0);
    CHECK(cu.cuGraphDestroy(graph) == 0);
    CHECK(cu.cuCtxPopCurrent_v2(&popped) == 0);
    mapping_mirror_destroy(m); /* reaps the node, then the family goes */
    CHECK(mapping_buffer_native(gpu, &native) == MAPPING_ERR_INVALID_HANDLE);
    teardown(&g);
}

/* A graph's nodes address the mirror's device side: while a graph syncs
 * it, an eviction (by hand, or under a budget set since) is refused or
 * skips it; once the graph is gone, it goes. */
TEST(graph_sync_keeps_its_mirror_resident_under_a_memory_budget)
{
    graph_run g;
    graph_setup(&g);
    mapping_mirror *m, *other;
    CHECK_OK(mapping_mirror_create(g.dev, N, 0, &m));
    memset(mapping_mirror_cpu(m), 3, N);
    begin(&g);
    CHECK_OK(mapping_mirror_sync_to_gpu(g.s, m));
    end(&g);
    replay(&g);
    CHECK_STATUS(mapping_mirror_evict(m), MAPPING_ERR_BUSY);
    CHECK(strstr(mapping_last_error_message(), "graph") != NULL);
    CHECK_OK(mapping_device_set_memory_budget(g.dev, N)); /* room for one: the next mirror would evict m */
    /* Making another mirror of N bytes would have to evict m: refused, m stays. */
    CHECK_STATUS(mapping_mirror_create(g.dev, N, 0, &other), MAPPING_ERR_OUT_OF_DEVICE_MEMORY);
    CHECK(mapping_mirror_is_resident(m) == 1);
    replay(&g); /* m's nodes still address its device side */
    CHECK(mapping_mirror_is_resident(m) == 1);
    graph_destroy(&g);
    CHECK_OK(mapping_mirror_create(g.dev, 64, 0, &other)); /* any call reaps the graph's hold */
    mapping_mirror_destroy(other);
    CHECK_OK(mapping_mirror_evict(m));
    CHECK(mapping_mirror_is_resident(m) == 0);
    CHECK_OK(mapping_device_set_memory_budget(g.dev, 0));
    mapping_mirror_destroy(m);
    teardown(&g);
}

/* Bad input: clear statuses, nothing recorded. */
TEST(graph_sync_refuses_bad_input_and_mirrors_it_cannot_replay)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    mapping_mirror *m;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_mirror_create(dev, N, 0, &m));
    int capturing = -1;
    CHECK_OK(mapping_stream_capturing(s, &capturing));
    CHECK(capturing == 0);
    CHECK(mapping_stream_capturing(NULL, &capturing) == MAPPING_ERR_NULL_ARGUMENT);
    CHECK(mapping_stream_capturing(s, NULL) == MAPPING_ERR_NULL_ARGUMENT);
    CHECK(mapping_mirror_sync_in_graph(s, NULL, MAPPING_GPU, 0) == MAPPING_ERR_NULL_ARGUMENT);
    if (strcmp(test_backend(), "cuda") != 0) {
        CHECK(mapping_mirror_sync_in_graph(s, m, MAPPING_GPU, 0) == MAPPING_ERR_UNSUPPORTED);
        CHECK(strstr(mapping_last_error_message(), "graphs") != NULL);
        mapping_mirror_destroy(m);
        mapping_stream_destroy(s);
        return;
    }
    CHECK(mapping_mirror_sync_in_graph(NULL, m, MAPPING_GPU, 0) == MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(mapping_mirror_sync_in_graph(s, m, MAPPING_GPU, 0) == MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), "not being captured") != NULL);
    CHECK(mapping_mirror_sync_in_graph(s, m, (mapping_side)3, 0) == MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(mapping_mirror_sync_in_graph(s, m, MAPPING_GPU, (size_t)1 << 40) == MAPPING_ERR_INVALID_ARGUMENT);
    mapping_device *dev2 = test_device2();
    mapping_stream *s2;
    CHECK_OK(mapping_stream_create(dev2, &s2));
    CHECK(mapping_mirror_sync_in_graph(s2, m, MAPPING_GPU, 0) == MAPPING_ERR_DEVICE_MISMATCH);
    mapping_stream_destroy(s2);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == N); /* nothing happened */
    mapping_mirror_destroy(m);
    mapping_stream_destroy(s);
}

/* Mirrors whose work cannot run in a graph are refused under capture, and
 * the capture stays valid. */
TEST(graph_sync_refuses_pageable_unified_and_featured_mirrors)
{
    graph_run g;
    graph_setup(&g);
    unsigned char *pageable = malloc(N);
    CHECK(pageable != NULL);
    memset(pageable, 1, N);
    mapping_mirror *wrap, *unified = NULL, *diff = NULL, *tracked = NULL;
    CHECK_OK(mapping_mirror_wrap(g.dev, pageable, N, 0, &wrap));
    if (mapping_mirror_create(g.dev, N, MAPPING_MIRROR_TRACK_WRITES, &tracked) != MAPPING_OK)
        tracked = NULL; /* no tracking mechanism here */
    mapping_mirror_create(g.dev, N, MAPPING_MIRROR_UNIFIED, &unified);
    if (mapping_mirror_create(g.dev, N, MAPPING_MIRROR_DEVICE_DIFF, &diff) != MAPPING_OK)
        diff = NULL;
    begin(&g);
    CHECK(mapping_mirror_sync_to_gpu(g.s, wrap) == MAPPING_ERR_UNSUPPORTED);
    CHECK(strstr(mapping_last_error_message(), "pageable") != NULL);
    if (unified && mapping_mirror_is_unified(unified)) {
        CHECK(mapping_mirror_sync_to_cpu(g.s, unified) == MAPPING_ERR_UNSUPPORTED);
        CHECK(strstr(mapping_last_error_message(), "unified") != NULL);
    }
    if (diff) {
        CHECK(mapping_mirror_sync_in_graph(g.s, diff, MAPPING_CPU, 0) == MAPPING_ERR_UNSUPPORTED);
        CHECK(strstr(mapping_last_error_message(), "device diff") != NULL);
    }
    if (tracked) {
        CHECK(mapping_mirror_sync_to_gpu(g.s, tracked) == MAPPING_ERR_UNSUPPORTED);
        CHECK(strstr(mapping_last_error_message(), "write tracking") != NULL);
    }
    end(&g); /* the capture is still valid */
    replay(&g);
    CHECK(mapping_mirror_stale_bytes(wrap, MAPPING_GPU) == N); /* nothing was recorded */
    graph_destroy(&g);
    mapping_mirror_destroy(tracked);
    mapping_mirror_destroy(diff);
    mapping_mirror_destroy(unified);
    mapping_mirror_destroy(wrap);
    free(pageable);
    teardown(&g);
}
