/*
 * The library against raw OpenCL, in the same run: the same transfers
 * written directly against OpenCL the way an expert would (an in-order queue
 * of its own, page-locked memory from a mapped CL_MEM_ALLOC_HOST_PTR buffer,
 * blocking calls, and non-blocking calls + clFinish), next to the library's
 * blocking mapping_sync_to_gpu_range / mapping_sync_to_cpu_range from
 * mapping_allocate_cpu memory. Samples of the three are interleaved so that
 * drift in the machine's load hits all of them alike.
 *
 * The CLI does not link OpenCL: this file dlopens it (as the library does)
 * and resolves the few entry points it needs into a typed table.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define BENCH_HAVE_CL_HEADERS 1
#endif
#endif

#ifndef BENCH_HAVE_CL_HEADERS
BENCH_SECTION(bench_opencl_raw, 30, "opencl-raw", "the library against raw OpenCL (page-locked, blocking and async)")
{
    bench_note(ctx, "opencl-raw: skipped (built without OpenCL headers)");
    return 0;
}
#else
#define CL_TARGET_OPENCL_VERSION 120
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>

#define RAW_ENTRY_POINTS(X)                                                                                   \
    X(clCreateCommandQueue) X(clReleaseCommandQueue) X(clCreateBuffer) X(clReleaseMemObject)                 \
    X(clEnqueueMapBuffer) X(clEnqueueUnmapMemObject) X(clEnqueueWriteBuffer) X(clEnqueueReadBuffer)          \
    X(clFinish)

typedef struct raw_api {
#define RAW_FIELD_(name) __typeof__(&name) name;
    RAW_ENTRY_POINTS(RAW_FIELD_)
#undef RAW_FIELD_
} raw_api;

static int raw_load(raw_api *api, const char **why)
{
    const char *env = getenv("MAPPING_OPENCL_LIBRARY");
    void *lib = env && *env ? dlopen(env, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!lib && !(env && *env))
        lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib && !(env && *env))
        lib = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        *why = dlerror();
        return 1;
    }
#define RAW_RESOLVE_(name)                               \
    {                                                    \
        void *sym = dlsym(lib, #name);                   \
        if (!sym) {                                      \
            *why = "an entry point is missing: " #name; \
            return 1;                                    \
        }                                                \
        memcpy(&api->name, &sym, sizeof sym);            \
    }
    RAW_ENTRY_POINTS(RAW_RESOLVE_)
#undef RAW_RESOLVE_
    return 0; /* the handle stays open: the library holds it too */
}

/* One transfer, done four ways. */
typedef struct raw_job {
    raw_api         *cl;
    cl_command_queue queue;
    cl_mem           raw_buf;  /* the library's buffer, as a cl_mem */
    void            *raw_host; /* the library's mapped CL_MEM_ALLOC_HOST_PTR memory */
    cl_mem           own_buf;  /* the expert's own buffer */
    void            *own_host; /* and own mapped CL_MEM_ALLOC_HOST_PTR buffer */
    mapping_buffer  *lib_buf;
    void            *lib_host; /* mapping_allocate_cpu */
    size_t           bytes;
    int              h2d;
} raw_job;

static int raw_blocking(raw_job *j)
{
    cl_int err = j->h2d ? j->cl->clEnqueueWriteBuffer(j->queue, j->raw_buf, CL_TRUE, 0, j->bytes, j->raw_host, 0,
                                                      NULL, NULL)
                        : j->cl->clEnqueueReadBuffer(j->queue, j->raw_buf, CL_TRUE, 0, j->bytes, j->raw_host, 0,
                                                     NULL, NULL);
    return err != CL_SUCCESS;
}

static int raw_async_finish(raw_job *j)
{
    cl_int err = j->h2d ? j->cl->clEnqueueWriteBuffer(j->queue, j->raw_buf, CL_FALSE, 0, j->bytes, j->raw_host, 0,
                                                      NULL, NULL)
                        : j->cl->clEnqueueReadBuffer(j->queue, j->raw_buf, CL_FALSE, 0, j->bytes, j->raw_host, 0,
                                                     NULL, NULL);
    return err != CL_SUCCESS || j->cl->clFinish(j->queue) != CL_SUCCESS;
}

static int raw_own_memory(raw_job *j)
{
    cl_int err = j->h2d ? j->cl->clEnqueueWriteBuffer(j->queue, j->own_buf, CL_TRUE, 0, j->bytes, j->own_host, 0,
                                                      NULL, NULL)
                        : j->cl->clEnqueueReadBuffer(j->queue, j->own_buf, CL_TRUE, 0, j->bytes, j->own_host, 0,
                                                     NULL, NULL);
    return err != CL_SUCCESS;
}

static int library(raw_job *j)
{
    mapping_status st = j->h2d ? mapping_sync_to_gpu_range(NULL, j->lib_host, j->lib_buf, 0, j->bytes)
                               : mapping_sync_to_cpu_range(NULL, j->lib_buf, 0, j->lib_host, j->bytes);
    return st != MAPPING_OK;
}

enum { WAYS = 4 };
static int (*const ways[WAYS])(raw_job *) = {raw_blocking, raw_async_finish, raw_own_memory, library};

/* Median seconds per call of each way. Every call is timed alone and the
 * ways take turns call by call (rotating who goes first), so the load of a
 * shared machine, which comes and goes over milliseconds, falls on all of
 * them alike; the median of many single calls ignores the bursts. */
enum { MAX_ROUNDS = 4096 };
/* paired[0], paired[1]: the median over rounds of library time / raw
 * blocking time and / raw async time, each pair taken in the same round
 * (robust against load that drifts between rounds). */
static int measure(bench_ctx *ctx, raw_job *j, double out[WAYS], double paired[2])
{
    double once = 0;
    for (int w = 0; w < WAYS; w++) { /* warm-up, and a check that each works */
        double t0 = bench_now();
        if (ways[w](j))
            return 1;
        double t = bench_now() - t0;
        once = t > once ? t : once;
    }
    int rounds = bench_reps_for(once, ctx->quick ? 0.25 : 2.0); /* seconds per way */
    rounds = rounds < ctx->runs ? ctx->runs : rounds > MAX_ROUNDS ? MAX_ROUNDS : rounds;
    static double times[WAYS][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < WAYS; k++) {
            int w = (r + k) % WAYS;
            double t0 = bench_now();
            if (ways[w](j))
                return 1;
            times[w][r] = bench_now() - t0;
        }
    static double ratios[MAX_ROUNDS];
    for (int w = 0; w < 2; w++) {
        for (int r = 0; r < rounds; r++)
            ratios[r] = times[3][r] / times[w][r];
        paired[w] = bench_median(ratios, rounds);
    }
    for (int w = 0; w < WAYS; w++)
        out[w] = bench_median(times[w], rounds);
    return 0;
}

BENCH_SECTION(bench_opencl_raw, 30, "opencl-raw", "the library against raw OpenCL (page-locked, blocking and async)")
{
    if (strcmp(ctx->info.backend, "opencl") != 0) {
        bench_note(ctx, "opencl-raw: skipped (the device's back end is %s, not opencl)", ctx->info.backend);
        return 0;
    }
    raw_api cl;
    const char *why = "";
    if (raw_load(&cl, &why)) {
        bench_note(ctx, "opencl-raw: skipped (cannot load OpenCL here: %s)", why);
        return 0;
    }
    const size_t big = (size_t)256 << 20;
    mapping_native_device nd;
    raw_job j = {.cl = &cl};
    cl_mem pinned = NULL;
    cl_int err = CL_SUCCESS;
    int rc = 1;
    if (bench_check(mapping_device_native(ctx->dev, &nd), "native handles") ||
        bench_check(mapping_allocate_gpu(ctx->dev, big, &j.lib_buf), "allocate_gpu") ||
        bench_check(mapping_allocate_cpu(ctx->dev, big, &j.lib_host), "allocate_cpu"))
        goto out;
    /* Raw calls on the library's memory measure the library's overhead alone:
     * where the pages of a 256 MiB allocation land (huge pages or not) moves
     * bandwidth by more than 10% between two allocations of the same kind. The
     * expert's own queue, buffer and mapped pinned buffer are measured too
     * ("raw own mem"), to show that the library's memory is as good. */
    void *native_buf = NULL;
    if (bench_check(mapping_buffer_native(j.lib_buf, &native_buf), "native buffer"))
        goto out;
    j.raw_buf = native_buf;
    j.raw_host = j.lib_host;
    j.queue = cl.clCreateCommandQueue(nd.context, nd.device, 0, &err);
    if (err == CL_SUCCESS)
        j.own_buf = cl.clCreateBuffer(nd.context, CL_MEM_READ_WRITE, big, NULL, &err);
    if (err == CL_SUCCESS)
        pinned = cl.clCreateBuffer(nd.context, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, big, NULL, &err);
    if (err == CL_SUCCESS)
        j.own_host = cl.clEnqueueMapBuffer(j.queue, pinned, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, big, 0, NULL,
                                           NULL, &err);
    if (err != CL_SUCCESS) {
        bench_note(ctx, "opencl-raw: raw OpenCL setup failed with %d", err);
        goto out;
    }
    memset(j.own_host, 7, big);
    memset(j.lib_host, 7, big);

    static const char *const cols[] = {"raw blocking", "raw async+fin", "raw own mem", "library", "lib/raw blk",
                                       "lib/raw async"};
    double lat[2][WAYS], bw[2][WAYS], lat_ratio[2][2], bw_ratio[2][2];
    for (int h2d = 1; h2d >= 0; h2d--) {
        j.h2d = h2d;
        j.bytes = 64;
        if (measure(ctx, &j, lat[!h2d], lat_ratio[!h2d]))
            goto fail;
        j.bytes = big;
        if (measure(ctx, &j, bw[!h2d], bw_ratio[!h2d]))
            goto fail;
    }
    bench_table t;
    bench_table_begin(ctx, &t, "opencl_raw_latency",
                      "64-byte blocking copy from page-locked memory, us: library vs raw OpenCL (ratio: lower is better)",
                      "copy", 3, 6, cols);
    for (int d = 0; d < 2; d++)
        bench_table_row(&t, d ? "D2H 64 B" : "H2D 64 B",
                        (double[]){lat[d][0] * 1e6, lat[d][1] * 1e6, lat[d][2] * 1e6, lat[d][3] * 1e6,
                                   lat_ratio[d][0], lat_ratio[d][1]});
    bench_table_end(&t);
    bench_table_begin(ctx, &t, "opencl_raw_bandwidth",
                      "256 MiB copy from page-locked memory, GB/s: library vs raw OpenCL (ratio: higher is better)",
                      "copy", 2, 6, cols);
    for (int d = 0; d < 2; d++) {
        double g[WAYS];
        for (int w = 0; w < WAYS; w++)
            g[w] = (double)big / bw[d][w] * 1e-9;
        bench_table_row(&t, d ? "D2H 256 MiB" : "H2D 256 MiB",
                        (double[]){g[0], g[1], g[2], g[3], 1 / bw_ratio[d][0], 1 / bw_ratio[d][1]});
    }
    bench_table_end(&t);
    bench_note(ctx, "raw blocking / async+fin: raw calls on the library's memory; raw own mem: blocking, on the");
    bench_note(ctx, "expert's own buffers. targets: 64 B library/raw blocking <= 1.05 x; 256 MiB >= 0.98 x");
    bench_note(ctx, "ratios: median over rounds of the library's call against the raw call of the same round");
    bench_figure(ctx, "opencl_h2d_64B_lib_over_raw", lat_ratio[0][0], "x", "64 B H2D library / raw blocking");
    bench_figure(ctx, "opencl_d2h_64B_lib_over_raw", lat_ratio[1][0], "x", "64 B D2H library / raw blocking");
    bench_figure(ctx, "opencl_h2d_256MiB_lib_over_raw", 1 / bw_ratio[0][0], "x", "256 MiB H2D library / raw GB/s");
    bench_figure(ctx, "opencl_d2h_256MiB_lib_over_raw", 1 / bw_ratio[1][0], "x", "256 MiB D2H library / raw GB/s");
    rc = 0;
    goto out;
fail:
    bench_note(ctx, "opencl-raw: a transfer failed: %s", mapping_last_error_message());
out:
    if (j.own_host) {
        cl.clEnqueueUnmapMemObject(j.queue, pinned, j.own_host, 0, NULL, NULL);
        cl.clFinish(j.queue);
    }
    if (pinned)
        cl.clReleaseMemObject(pinned);
    if (j.own_buf)
        cl.clReleaseMemObject(j.own_buf);
    if (j.queue)
        cl.clReleaseCommandQueue(j.queue);
    mapping_free_cpu(ctx->dev, j.lib_host);
    mapping_free_gpu(j.lib_buf);
    return rc;
}
#endif
