/*
 * Mirror syncs in a CUDA graph (mapping_mirror_sync_in_graph), against the
 * same loop run eagerly: an iteration is [sync the mirror to the GPU, device
 * work (a 1 MiB fill of another buffer, standing in for a kernel), sync it
 * back to the CPU] on one stream, then a stream synchronize; before each,
 * the CPU writes (and marks) 16 scattered 64-byte ranges and marks 16 others
 * as written by the device. The graph loop replays one captured graph of
 * the three steps 1,000 times (200 with --quick); the eager loop calls them.
 * Figures: microseconds per iteration each way and the graph's saving, with
 * nothing stale and with the 2 x 16 ranges; and the replays whose bytes
 * moved were not the bytes stale at that replay (target 0), checked with
 * the statistics after every replay. The driver is opened as the back end
 * opens it, in the device's primary context, for the capture and launches.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"

typedef struct graph_driver {
    int (*push)(void *);
    int (*pop)(void **);
    int (*begin)(void *, int);
    int (*end)(void *, void **);
    int (*instantiate)(void **, void *, unsigned long long);
    int (*launch)(void *, void *);
    int (*exec_destroy)(void *);
    int (*destroy)(void *);
} graph_driver;

static int load_driver(graph_driver *cu)
{
    static const char *const names[] = {"cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuStreamBeginCapture_v2",
                                        "cuStreamEndCapture", "cuGraphInstantiateWithFlags", "cuGraphLaunch",
                                        "cuGraphExecDestroy", "cuGraphDestroy"};
    const char *env = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = env && *env ? dlopen(env, RTLD_NOW | RTLD_LOCAL) : dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib && !(env && *env))
        lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    void *syms[8];
    for (int i = 0; i < 8; i++)
        if (!lib || !(syms[i] = dlsym(lib, names[i])))
            return 0;
    memcpy(cu, syms, sizeof syms); /* the struct's members in the order of names */
    return 1;
}

enum { MIRROR_BYTES = 16 << 20, RANGES = 16, RANGE_BYTES = 64, WORK_BYTES = 1 << 20 };

typedef struct graph_loop {
    graph_driver    cu;
    void           *ctx, *native, *graph, *exec;
    mapping_device *dev;
    mapping_stream *s;
    mapping_mirror *m;
    mapping_buffer *work;
    unsigned long long rng;
    int             ranges; /* per side per iteration */
    long            mismatches;
} graph_loop;

/* The iteration's marks: RANGES CPU writes and RANGES device writes, on
 * disjoint slots (the CPU's in even 4 KiB slots, the device's in odd). */
static int mark(graph_loop *g)
{
    unsigned char *cpu = mapping_mirror_cpu(g->m);
    for (int i = 0; i < g->ranges; i++) {
        g->rng = g->rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t slot = (size_t)(g->rng >> 33) % (MIRROR_BYTES / 8192), at = slot * 8192;
        cpu[at] ^= 1;
        if (mapping_mirror_mark_cpu_modified(g->m, at, RANGE_BYTES) ||
            mapping_mirror_mark_gpu_modified(g->m, at + 4096, RANGE_BYTES))
            return 1;
    }
    return 0;
}

static int steps(graph_loop *g)
{
    return mapping_mirror_sync_to_gpu(g->s, g->m) || mapping_fill_gpu(g->s, g->work, 0, WORK_BYTES, 1) ||
           mapping_mirror_sync_to_cpu(g->s, g->m);
}

static int eager_iteration(void *arg)
{
    graph_loop *g = arg;
    return mark(g) || steps(g) || mapping_stream_synchronize(g->s);
}

static int graph_iteration(void *arg)
{
    graph_loop *g = arg;
    void *popped;
    if (mark(g))
        return 1;
    mapping_stats before, after;
    mapping_device_stats(g->dev, &before);
    size_t up = mapping_mirror_stale_bytes(g->m, MAPPING_GPU), down = mapping_mirror_stale_bytes(g->m, MAPPING_CPU);
    if (g->cu.push(g->ctx) || g->cu.launch(g->exec, g->native) || g->cu.pop(&popped) ||
        mapping_stream_synchronize(g->s))
        return 1;
    mapping_device_stats(g->dev, &after);
    g->mismatches += after.h2d_bytes - before.h2d_bytes != up || after.d2h_bytes - before.d2h_bytes != down;
    return 0;
}

static int capture(graph_loop *g)
{
    void *popped;
    int rc = g->cu.push(g->ctx) || g->cu.begin(g->native, 0);
    g->cu.pop(&popped);
    rc = rc || steps(g);
    if (g->cu.push(g->ctx) == 0) {
        rc |= g->cu.end(g->native, &g->graph) != 0;
        rc = rc || g->cu.instantiate(&g->exec, g->graph, 0);
        g->cu.pop(&popped);
    }
    return rc;
}

static void report(bench_ctx *ctx, const double eager[2], const double graph[2], long replays, long mismatches)
{
    static const char *const cols[] = {"eager us", "graph us", "graph saves us"};
    bench_table t;
    bench_table_begin(ctx, &t, "cuda_graph_loop",
                      "a loop of [mirror sync to GPU, 1 MiB fill, mirror sync to CPU] + stream synchronize, per "
                      "iteration",
                      "stale before each", 2, 3, cols);
    const char *labels[2] = {"nothing", "16 + 16 x 64 B"};
    for (int i = 0; i < 2; i++)
        bench_table_row(&t, labels[i], (double[]){eager[i] * 1e6, graph[i] * 1e6, (eager[i] - graph[i]) * 1e6});
    bench_table_end(&t);
    bench_note(ctx, "%ld replays checked; each moved exactly the bytes stale then: %ld did not", replays,
               replays - mismatches >= 0 ? mismatches : 0);
    bench_figure(ctx, "cuda_graph_us_per_iteration_clean", graph[0] * 1e6, "us",
                 "graph replay of two mirror syncs and a fill, nothing stale, per iteration");
    bench_figure(ctx, "cuda_graph_us_per_iteration_eager_clean", eager[0] * 1e6, "us",
                 "the same loop called eagerly, per iteration");
    bench_figure(ctx, "cuda_graph_us_per_iteration_stale", graph[1] * 1e6, "us",
                 "graph replay with 16 + 16 ranges of 64 B stale, per iteration");
    bench_figure(ctx, "cuda_graph_us_per_iteration_eager_stale", eager[1] * 1e6, "us",
                 "the same loop called eagerly, per iteration");
    bench_figure(ctx, "cuda_graph_replays_moving_other_than_stale", (double)mismatches, "replays",
                 "replays whose bytes moved were not the bytes stale then (target <= 0)");
}

static int run_loops(bench_ctx *ctx, graph_loop *g)
{
    int iterations = ctx->quick ? 200 : 1000;
    double eager[2], graph[2];
    long replays = 0;
    for (int stale = 0; stale < 2; stale++) {
        g->ranges = stale ? RANGES : 0;
        double t0 = bench_now();
        for (int i = 0; i < iterations; i++)
            if (eager_iteration(g))
                return bench_check(MAPPING_ERR_DRIVER, "the eager loop");
        eager[stale] = (bench_now() - t0) / iterations;
        t0 = bench_now();
        for (int i = 0; i < iterations; i++, replays++)
            if (graph_iteration(g))
                return bench_check(MAPPING_ERR_DRIVER, "the graph loop");
        graph[stale] = (bench_now() - t0) / iterations;
        bench_progress(ctx, "cuda-graph: %d of 2", stale + 1);
    }
    report(ctx, eager, graph, replays, g->mismatches);
    return 0;
}

BENCH_SECTION(bench_cuda_graph, 92, "cuda-graph",
              "cuda only: mirror syncs recorded in a CUDA graph and replayed, against the same loop called eagerly; "
              "bytes moved against bytes stale at every replay")
{
    if (strcmp(ctx->info.backend, "cuda") != 0) {
        fprintf(ctx->out, "\ncuda-graph: skipped (the device's back end is %s, not cuda)\n", ctx->info.backend);
        return 0;
    }
    graph_loop g = {.dev = ctx->dev, .rng = 12345};
    mapping_native_device native;
    if (!load_driver(&g.cu) || bench_check(mapping_device_native(ctx->dev, &native), "native handles")) {
        fprintf(ctx->out, "\ncuda-graph: skipped (the driver's graph calls cannot be reached)\n");
        return 0;
    }
    g.ctx = native.context;
    int rc = 1;
    void *popped;
    if (bench_check(mapping_stream_create(ctx->dev, &g.s), "mapping_stream_create") ||
        bench_check(mapping_stream_native(g.s, &g.native), "mapping_stream_native") ||
        bench_check(mapping_mirror_create(ctx->dev, MIRROR_BYTES, 0, &g.m), "mapping_mirror_create") ||
        bench_check(mapping_allocate_gpu(ctx->dev, WORK_BYTES, &g.work), "mapping_allocate_gpu") ||
        bench_check(mapping_mirror_sync_to_gpu(NULL, g.m), "mapping_mirror_sync_to_gpu"))
        goto out;
    if (capture(&g)) {
        fprintf(stderr, "mapping bench: cuda-graph: the capture failed: %s\n", mapping_last_error_message());
        goto out;
    }
    rc = run_loops(ctx, &g);
out:
    if (g.cu.push(g.ctx) == 0) {
        if (g.exec)
            g.cu.exec_destroy(g.exec);
        if (g.graph)
            g.cu.destroy(g.graph);
        g.cu.pop(&popped);
    }
    mapping_mirror_destroy(g.m);
    if (g.work)
        mapping_free_gpu(g.work);
    if (g.s)
        mapping_stream_destroy(g.s);
    return rc;
}
