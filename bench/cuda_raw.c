/*
 * The library against the CUDA driver called directly, in the same run: 64 B
 * and large blocking copies from page-locked memory, cuMemcpyHtoD/DtoH on
 * cuMemHostAlloc memory (the baseline) against mapping_sync_to_gpu_range /
 * mapping_sync_to_cpu_range on mapping_allocate_cpu memory. Goals: large
 * copies at >= 0.95x the driver's bandwidth, 64 B copies within 1 us of it.
 *
 * The CLI does not link libcuda: the baseline opens the same driver library
 * the back end uses ($MAPPING_CUDA_LIBRARY, libcuda.so.1, libcuda.so) with
 * dlopen and works in the device's own (primary) context. The library is
 * measured with no context current on the thread, as a program that never
 * calls CUDA itself would use it; the baseline with its context current.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"

typedef int cu_result;
typedef unsigned long long cu_deviceptr;
typedef void *cu_context;

typedef struct raw_driver {
    cu_result (*ctx_push)(cu_context);
    cu_result (*ctx_pop)(cu_context *);
    cu_result (*mem_alloc)(cu_deviceptr *, size_t);
    cu_result (*mem_free)(cu_deviceptr);
    cu_result (*host_alloc)(void **, size_t, unsigned);
    cu_result (*host_free)(void *);
    cu_result (*htod)(cu_deviceptr, const void *, size_t);
    cu_result (*dtoh)(void *, cu_deviceptr, size_t);
} raw_driver;

static int raw_load(raw_driver *cu, char *why, size_t why_size)
{
    const char *env = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = env && *env ? dlopen(env, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!lib && !(env && *env))
        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib && !(env && *env))
        lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, why_size, "cannot dlopen libcuda: %s", dlerror());
        return 0;
    }
    *(void **)&cu->ctx_push = dlsym(lib, "cuCtxPushCurrent_v2");
    *(void **)&cu->ctx_pop = dlsym(lib, "cuCtxPopCurrent_v2");
    *(void **)&cu->mem_alloc = dlsym(lib, "cuMemAlloc_v2");
    *(void **)&cu->mem_free = dlsym(lib, "cuMemFree_v2");
    *(void **)&cu->host_alloc = dlsym(lib, "cuMemHostAlloc");
    *(void **)&cu->host_free = dlsym(lib, "cuMemFreeHost");
    *(void **)&cu->htod = dlsym(lib, "cuMemcpyHtoD_v2");
    *(void **)&cu->dtoh = dlsym(lib, "cuMemcpyDtoH_v2");
    if (!cu->ctx_push || !cu->ctx_pop || !cu->mem_alloc || !cu->mem_free || !cu->host_alloc || !cu->host_free ||
        !cu->htod || !cu->dtoh) {
        snprintf(why, why_size, "libcuda lacks an entry point the baseline needs");
        return 0;
    }
    return 1;
}

typedef struct raw_job {
    const raw_driver *cu;
    cu_deviceptr      dptr;
    void             *host;
    size_t            bytes;
} raw_job;

static int raw_h2d(void *arg)
{
    raw_job *j = arg;
    return j->cu->htod(j->dptr, j->host, j->bytes) != 0;
}

static int raw_d2h(void *arg)
{
    raw_job *j = arg;
    return j->cu->dtoh(j->host, j->dptr, j->bytes) != 0;
}

typedef struct lib_job {
    mapping_buffer *buf;
    void           *host;
    size_t          bytes;
} lib_job;

static int lib_h2d(void *arg)
{
    lib_job *j = arg;
    return mapping_sync_to_gpu_range(NULL, j->host, j->buf, 0, j->bytes) != MAPPING_OK;
}

static int lib_d2h(void *arg)
{
    lib_job *j = arg;
    return mapping_sync_to_cpu_range(NULL, j->buf, 0, j->host, j->bytes) != MAPPING_OK;
}

/* Median seconds per call, reps sized from one warm-up call. */
static double timed(bench_ctx *ctx, int (*fn)(void *), void *arg)
{
    double t0 = bench_now();
    if (fn(arg) != 0)
        return NAN;
    double once = bench_now() - t0;
    return bench_time(ctx, bench_reps_for(once, ctx->quick ? 0.01 : 0.05), fn, arg);
}

/* Baseline calls need the context current; the library's run without it. */
static double timed_raw(bench_ctx *ctx, const raw_driver *cu, cu_context c, int (*fn)(void *), raw_job *job)
{
    if (cu->ctx_push(c) != 0)
        return NAN;
    double t = timed(ctx, fn, job);
    cu_context popped;
    cu->ctx_pop(&popped);
    return t;
}

BENCH_SECTION(bench_cuda_raw, 90, "cuda-raw",
              "cuda only: 64 B and 256 MiB blocking copies, library vs direct cuMemcpyHtoD/DtoH")
{
    if (strcmp(ctx->info.backend, "cuda") != 0) {
        fprintf(ctx->out, "\ncuda-raw: skipped (the device's back end is %s, not cuda)\n", ctx->info.backend);
        return 0;
    }
    raw_driver cu;
    char why[256];
    if (!raw_load(&cu, why, sizeof why)) {
        fprintf(ctx->out, "\ncuda-raw: skipped (%s)\n", why);
        return 0;
    }
    mapping_native_device native;
    if (bench_check(mapping_native_device_handles(ctx->dev, &native), "native handles"))
        return 1;

    const size_t big = ctx->quick ? (size_t)32 << 20 : (size_t)256 << 20, small = 64;
    cu_deviceptr raw_dev = 0;
    void *raw_host = NULL, *lib_host = NULL;
    mapping_buffer *lib_buf = NULL;
    int rc = 1, pushed = cu.ctx_push(native.context) == 0;
    if (pushed && cu.mem_alloc(&raw_dev, big) == 0 && cu.host_alloc(&raw_host, big, 1 /* portable */) == 0)
        memset(raw_host, 7, big);
    cu_context popped;
    if (pushed)
        cu.ctx_pop(&popped);
    if (!raw_dev || !raw_host) {
        fprintf(stderr, "mapping bench: cuda-raw: the baseline's cuMemAlloc / cuMemHostAlloc failed\n");
        goto out;
    }
    if (bench_check(mapping_allocate_gpu(ctx->dev, big, &lib_buf), "allocate_gpu") ||
        bench_check(mapping_allocate_cpu(ctx->dev, big, &lib_host), "allocate_cpu"))
        goto out;
    memset(lib_host, 7, big);

    double raw_t[4], lib_t[4]; /* H2D small, D2H small, H2D big, D2H big */
    for (int i = 0; i < 4; i++) {
        size_t bytes = i < 2 ? small : big;
        raw_job rj = {&cu, raw_dev, raw_host, bytes};
        lib_job lj = {lib_buf, lib_host, bytes};
        raw_t[i] = timed_raw(ctx, &cu, native.context, i % 2 ? raw_d2h : raw_h2d, &rj);
        lib_t[i] = timed(ctx, i % 2 ? lib_d2h : lib_h2d, &lj);
    }

    static const char *const lat_cols[] = {"driver us", "mapping us", "extra us", "mapping/driver"};
    bench_table t;
    bench_table_begin(ctx, &t, "cuda_raw_latency", "64 B blocking copy from page-locked memory: driver vs mapping",
                      "copy", 3, 4, lat_cols);
    for (int i = 0; i < 2; i++)
        bench_table_row(&t, i ? "D2H 64 B" : "H2D 64 B",
                        (double[]){raw_t[i] * 1e6, lib_t[i] * 1e6, (lib_t[i] - raw_t[i]) * 1e6, lib_t[i] / raw_t[i]});
    bench_table_end(&t);

    char size_name[32], title[128];
    bench_size_name(big, size_name, sizeof size_name);
    snprintf(title, sizeof title, "%s blocking copy from page-locked memory, GB/s: driver vs mapping", size_name);
    static const char *const bw_cols[] = {"driver GB/s", "mapping GB/s", "mapping/driver"};
    bench_table_begin(ctx, &t, "cuda_raw_bandwidth", title, "copy", 2, 3, bw_cols);
    double ratio[2];
    for (int i = 2; i < 4; i++) {
        double raw_bw = (double)big / raw_t[i] * 1e-9, lib_bw = (double)big / lib_t[i] * 1e-9;
        ratio[i - 2] = lib_bw / raw_bw;
        char label[48];
        snprintf(label, sizeof label, "%s %s", i == 2 ? "H2D" : "D2H", size_name);
        bench_table_row(&t, label, (double[]){raw_bw, lib_bw, ratio[i - 2]});
    }
    bench_table_end(&t);
    bench_note(ctx, "goals: large copies >= 0.95x the driver; 64 B copies within 1 us of it");
    bench_figure(ctx, "cuda_h2d_big_over_driver", ratio[0], "x", "H2D large, mapping / direct driver");
    bench_figure(ctx, "cuda_d2h_big_over_driver", ratio[1], "x", "D2H large, mapping / direct driver");
    bench_figure(ctx, "cuda_h2d_64B_extra_us", (lib_t[0] - raw_t[0]) * 1e6, "us", "H2D 64 B, mapping - driver");
    bench_figure(ctx, "cuda_d2h_64B_extra_us", (lib_t[1] - raw_t[1]) * 1e6, "us", "D2H 64 B, mapping - driver");
    rc = 0;
out:
    mapping_free_cpu(ctx->dev, lib_host);
    mapping_free_gpu(lib_buf);
    if ((raw_dev || raw_host) && cu.ctx_push(native.context) == 0) {
        if (raw_host)
            cu.host_free(raw_host);
        if (raw_dev)
            cu.mem_free(raw_dev);
        cu.ctx_pop(&popped);
    }
    return rc;
}
