/*
 * The library against the CUDA driver called directly, in the same run:
 * - 64 B blocking copies from page-locked memory (latency);
 * - 256 MiB (32 MiB with --quick) blocking copies, page-locked and pageable,
 *   H2D and D2H, and D2D;
 * - a batch of 10,000 scattered 64-byte copies (pageable) against 10,000
 *   cuMemcpy*Async_v2 from page-locked memory on one stream;
 * - a mirror sync of 1,000 scattered 64-byte ranges against 1,000
 *   cuMemcpyHtoDAsync_v2 from page-locked memory on one stream.
 * Each figure is a ratio: mapping's speed over the driver's (driver time /
 * mapping time), so 1 = the same, > 1 faster. Goals: large copies >= 0.95x,
 * 64 B copies within 1 us of the driver.
 *
 * The CLI does not link libcuda: the baseline opens the same driver library
 * the back end uses ($MAPPING_CUDA_LIBRARY, libcuda.so.1, libcuda.so) with
 * dlopen and works in the device's own (primary) context. The library is
 * measured with no context current on the thread, as a program that never
 * calls CUDA itself would use it; the baseline with its context current.
 */
#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"

typedef int cu_result;
typedef unsigned long long cu_deviceptr;
typedef void *cu_context;
typedef void *cu_stream;

typedef struct raw_driver {
    cu_result (*ctx_push)(cu_context);
    cu_result (*ctx_pop)(cu_context *);
    cu_result (*mem_alloc)(cu_deviceptr *, size_t);
    cu_result (*mem_free)(cu_deviceptr);
    cu_result (*host_alloc)(void **, size_t, unsigned);
    cu_result (*host_free)(void *);
    cu_result (*htod)(cu_deviceptr, const void *, size_t);
    cu_result (*dtoh)(void *, cu_deviceptr, size_t);
    cu_result (*dtod)(cu_deviceptr, cu_deviceptr, size_t);
    cu_result (*htod_async)(cu_deviceptr, const void *, size_t, cu_stream);
    cu_result (*dtoh_async)(void *, cu_deviceptr, size_t, cu_stream);
    cu_result (*stream_create)(cu_stream *, unsigned);
    cu_result (*stream_destroy)(cu_stream);
    cu_result (*stream_sync)(cu_stream);
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
    static const struct {
        const char *name;
        size_t      offset;
    } syms[] = {
        {"cuCtxPushCurrent_v2", offsetof(raw_driver, ctx_push)},
        {"cuCtxPopCurrent_v2", offsetof(raw_driver, ctx_pop)},
        {"cuMemAlloc_v2", offsetof(raw_driver, mem_alloc)},
        {"cuMemFree_v2", offsetof(raw_driver, mem_free)},
        {"cuMemHostAlloc", offsetof(raw_driver, host_alloc)},
        {"cuMemFreeHost", offsetof(raw_driver, host_free)},
        {"cuMemcpyHtoD_v2", offsetof(raw_driver, htod)},
        {"cuMemcpyDtoH_v2", offsetof(raw_driver, dtoh)},
        {"cuMemcpyDtoD_v2", offsetof(raw_driver, dtod)},
        {"cuMemcpyHtoDAsync_v2", offsetof(raw_driver, htod_async)},
        {"cuMemcpyDtoHAsync_v2", offsetof(raw_driver, dtoh_async)},
        {"cuStreamCreate", offsetof(raw_driver, stream_create)},
        {"cuStreamDestroy_v2", offsetof(raw_driver, stream_destroy)},
        {"cuStreamSynchronize", offsetof(raw_driver, stream_sync)},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *p = dlsym(lib, syms[i].name);
        if (!p) {
            snprintf(why, why_size, "libcuda lacks %s, which the baseline needs", syms[i].name);
            return 0;
        }
        memcpy((char *)cu + syms[i].offset, &p, sizeof p);
    }
    return 1;
}

enum { SMALL = 64, STRIDE = 3 * SMALL, BATCH_COPIES = 10000, MIRROR_RANGES = 1000, MIRROR_STRIDE = 4096 };

/* Everything one run of the section uses. */
typedef struct raw_bench {
    bench_ctx        *ctx;
    raw_driver        cu;
    cu_context        context;
    size_t            big;
    /* the baseline's */
    cu_deviceptr      raw_dev, raw_dev2;
    void             *raw_pinned, *raw_pageable;
    cu_stream         raw_stream;
    /* the library's */
    mapping_buffer   *buf, *buf2;
    void             *lib_pinned, *lib_pageable;
    mapping_batch    *batch;
    mapping_mirror   *mirror;
    /* one measurement */
    int               dir; /* 0 H2D, 1 D2H, 2 D2D */
    size_t            bytes;
    int               pageable;
} raw_bench;

/* ---- the baseline's runs (context current) ---- */

static int raw_copy(void *arg)
{
    raw_bench *r = arg;
    const raw_driver *cu = &r->cu;
    void *host = r->pageable ? r->raw_pageable : r->raw_pinned;
    if (r->dir == 1)
        return cu->dtoh(host, r->raw_dev, r->bytes) != 0;
    /* From pageable memory, and device to device, the call may return
     * before the copy is done: wait as the library does. */
    cu_result e = r->dir == 0 ? cu->htod(r->raw_dev, host, r->bytes) : cu->dtod(r->raw_dev2, r->raw_dev, r->bytes);
    if (e == 0 && (r->dir == 2 || r->pageable))
        e = cu->stream_sync(NULL);
    return e != 0;
}

/* n scattered 64-byte copies from page-locked memory on one stream. */
static int raw_scattered(void *arg, size_t n, size_t stride, int d2h)
{
    raw_bench *r = arg;
    const raw_driver *cu = &r->cu;
    char *host = r->raw_pinned;
    for (size_t i = 0; i < n; i++) {
        cu_result e = d2h ? cu->dtoh_async(host + i * SMALL, r->raw_dev + i * stride, SMALL, r->raw_stream)
                          : cu->htod_async(r->raw_dev + i * stride, host + i * SMALL, SMALL, r->raw_stream);
        if (e != 0)
            return 1;
    }
    return cu->stream_sync(r->raw_stream) != 0;
}

static int raw_batch(void *arg)
{
    raw_bench *r = arg;
    return raw_scattered(arg, BATCH_COPIES, STRIDE, r->dir == 1);
}

static int raw_mirror(void *arg)
{
    return raw_scattered(arg, MIRROR_RANGES, MIRROR_STRIDE, 0);
}

/* ---- the library's runs (no context current) ---- */

static int lib_copy(void *arg)
{
    raw_bench *r = arg;
    void *host = r->pageable ? r->lib_pageable : r->lib_pinned;
    mapping_status st = r->dir == 0   ? mapping_sync_to_gpu_range(NULL, host, r->buf, 0, r->bytes)
                        : r->dir == 1 ? mapping_sync_to_cpu_range(NULL, r->buf, 0, host, r->bytes)
                                      : mapping_copy_gpu(NULL, r->buf, 0, r->buf2, 0, r->bytes);
    return st != MAPPING_OK;
}

static int lib_batch(void *arg)
{
    raw_bench *r = arg;
    char *host = r->lib_pageable;
    for (size_t i = 0; i < BATCH_COPIES; i++) {
        mapping_status st = r->dir == 0 ? mapping_batch_add_to_gpu(r->batch, host + i * SMALL, r->buf, i * STRIDE, SMALL)
                                        : mapping_batch_add_to_cpu(r->batch, r->buf, i * STRIDE, host + i * SMALL, SMALL);
        if (st != MAPPING_OK)
            return 1;
    }
    return mapping_batch_flush(NULL, r->batch) != MAPPING_OK;
}

static int lib_mirror(void *arg)
{
    raw_bench *r = arg;
    for (size_t i = 0; i < MIRROR_RANGES; i++)
        if (mapping_mirror_mark_cpu_modified(r->mirror, i * MIRROR_STRIDE, SMALL) != MAPPING_OK)
            return 1;
    return mapping_mirror_sync_to_gpu(NULL, r->mirror) != MAPPING_OK;
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
static double timed_raw(raw_bench *r, int (*fn)(void *))
{
    if (r->cu.ctx_push(r->context) != 0)
        return NAN;
    double t = timed(r->ctx, fn, r);
    cu_context popped;
    r->cu.ctx_pop(&popped);
    return t;
}

/* Times the baseline and the library for one setting: [0] driver, [1] mapping. */
static void measure(raw_bench *r, int dir, size_t bytes, int pageable, int (*raw_fn)(void *), int (*lib_fn)(void *),
                    double t[2])
{
    r->dir = dir;
    r->bytes = bytes;
    r->pageable = pageable;
    t[0] = timed_raw(r, raw_fn);
    t[1] = timed(r->ctx, lib_fn, r);
}

static int raw_setup(raw_bench *r)
{
    const raw_driver *cu = &r->cu;
    size_t host_bytes = r->big > (size_t)BATCH_COPIES * SMALL ? r->big : (size_t)BATCH_COPIES * SMALL;
    if (cu->ctx_push(r->context) != 0)
        return 1;
    int ok = cu->mem_alloc(&r->raw_dev, r->big) == 0 && cu->mem_alloc(&r->raw_dev2, r->big) == 0 &&
             cu->host_alloc(&r->raw_pinned, host_bytes, 1 /* portable */) == 0 &&
             cu->stream_create(&r->raw_stream, 1 /* non-blocking */) == 0;
    cu_context popped;
    cu->ctx_pop(&popped);
    r->raw_pageable = malloc(r->big);
    if (!ok || !r->raw_pageable) {
        fprintf(stderr, "mapping bench: cuda-raw: the baseline's allocations failed\n");
        return 1;
    }
    memset(r->raw_pinned, 7, host_bytes);
    memset(r->raw_pageable, 7, r->big);
    return 0;
}

static int lib_setup(raw_bench *r)
{
    size_t host_bytes = r->big > (size_t)BATCH_COPIES * SMALL ? r->big : (size_t)BATCH_COPIES * SMALL;
    if (bench_check(mapping_allocate_gpu(r->ctx->dev, r->big, &r->buf), "allocate_gpu") ||
        bench_check(mapping_allocate_gpu(r->ctx->dev, r->big, &r->buf2), "allocate_gpu") ||
        bench_check(mapping_allocate_cpu(r->ctx->dev, host_bytes, &r->lib_pinned), "allocate_cpu") ||
        bench_check(mapping_batch_create(r->ctx->dev, &r->batch), "batch_create") ||
        bench_check(mapping_mirror_create(r->ctx->dev, (size_t)MIRROR_RANGES * MIRROR_STRIDE, 0, &r->mirror),
                    "mirror_create"))
        return 1;
    if (!(r->lib_pageable = malloc(r->big)))
        return 1;
    memset(r->lib_pinned, 7, host_bytes);
    memset(r->lib_pageable, 7, r->big);
    return 0;
}

static void teardown(raw_bench *r)
{
    mapping_mirror_destroy(r->mirror);
    mapping_batch_destroy(r->batch);
    mapping_free_cpu(r->ctx->dev, r->lib_pinned);
    mapping_free_gpu(r->buf);
    mapping_free_gpu(r->buf2);
    free(r->lib_pageable);
    free(r->raw_pageable);
    const raw_driver *cu = &r->cu;
    if (cu->ctx_push && cu->ctx_push(r->context) == 0) {
        if (r->raw_stream)
            cu->stream_destroy(r->raw_stream);
        if (r->raw_pinned)
            cu->host_free(r->raw_pinned);
        if (r->raw_dev)
            cu->mem_free(r->raw_dev);
        if (r->raw_dev2)
            cu->mem_free(r->raw_dev2);
        cu_context popped;
        cu->ctx_pop(&popped);
    }
}

BENCH_SECTION(bench_cuda_raw, 90, "cuda-raw",
              "cuda only: the library vs direct driver calls: 64 B and 256 MiB copies (page-locked, pageable, D2D), "
              "a batch of 10k x 64 B, a mirror sync of 1,000 ranges")
{
    if (strcmp(ctx->info.backend, "cuda") != 0) {
        fprintf(ctx->out, "\ncuda-raw: skipped (the device's back end is %s, not cuda)\n", ctx->info.backend);
        return 0;
    }
    raw_bench r = {.ctx = ctx, .big = ctx->quick ? (size_t)32 << 20 : (size_t)256 << 20};
    char why[256];
    if (!raw_load(&r.cu, why, sizeof why)) {
        fprintf(ctx->out, "\ncuda-raw: skipped (%s)\n", why);
        return 0;
    }
    mapping_native_device native;
    if (bench_check(mapping_device_native(ctx->dev, &native), "native handles"))
        return 1;
    r.context = native.context;
    int rc = 1;
    if (raw_setup(&r) || lib_setup(&r))
        goto out;

    /* Latency: 64 B from page-locked memory. */
    double lat[2][2];
    for (int dir = 0; dir < 2; dir++)
        measure(&r, dir, SMALL, 0, raw_copy, lib_copy, lat[dir]);
    static const char *const lat_cols[] = {"driver us", "mapping us", "extra us", "speed ratio"};
    bench_table t;
    bench_table_begin(ctx, &t, "cuda_raw_latency", "64 B blocking copy from page-locked memory: driver vs mapping",
                      "copy", 3, 4, lat_cols);
    for (int i = 0; i < 2; i++)
        bench_table_row(&t, i ? "D2H 64 B" : "H2D 64 B",
                        (double[]){lat[i][0] * 1e6, lat[i][1] * 1e6, (lat[i][1] - lat[i][0]) * 1e6,
                                   lat[i][0] / lat[i][1]});
    bench_table_end(&t);
    /* Figures follow each table, so a run stopped midway still has some. */
    bench_note(ctx, "speed ratio = driver time / mapping time (1 = the same, > 1 = mapping faster)");
    bench_figure(ctx, "cuda_h2d_64B_over_driver", lat[0][0] / lat[0][1], "x", "H2D 64 B, mapping speed / driver");
    bench_figure(ctx, "cuda_d2h_64B_over_driver", lat[1][0] / lat[1][1], "x", "D2H 64 B, mapping speed / driver");
    bench_figure(ctx, "cuda_h2d_64B_extra_us", (lat[0][1] - lat[0][0]) * 1e6, "us", "H2D 64 B, mapping - driver");
    bench_figure(ctx, "cuda_d2h_64B_extra_us", (lat[1][1] - lat[1][0]) * 1e6, "us", "D2H 64 B, mapping - driver");

    /* Bandwidth: H2D, D2H page-locked and pageable, D2D. */
    struct {
        const char *label, *id, *what;
        int         dir, pageable;
        double      t[2];
    } bw[] = {
        {"H2D locked", "cuda_h2d_big_over_driver", "H2D large, page-locked", 0, 0, {0, 0}},
        {"D2H locked", "cuda_d2h_big_over_driver", "D2H large, page-locked", 1, 0, {0, 0}},
        {"H2D pageable", "cuda_h2d_big_pageable_over_driver", "H2D large, pageable", 0, 1, {0, 0}},
        {"D2H pageable", "cuda_d2h_big_pageable_over_driver", "D2H large, pageable", 1, 1, {0, 0}},
        {"D2D", "cuda_d2d_big_over_driver", "D2D large", 2, 0, {0, 0}},
    };
    enum { BW_ROWS = sizeof bw / sizeof bw[0] };
    for (int i = 0; i < BW_ROWS; i++)
        measure(&r, bw[i].dir, r.big, bw[i].pageable, raw_copy, lib_copy, bw[i].t);
    char size_name[32], title[160];
    bench_size_name(r.big, size_name, sizeof size_name);
    snprintf(title, sizeof title, "%s blocking copies, GB/s: driver vs mapping", size_name);
    static const char *const bw_cols[] = {"driver GB/s", "mapping GB/s", "speed ratio"};
    bench_table_begin(ctx, &t, "cuda_raw_bandwidth", title, "copy", 2, 3, bw_cols);
    for (int i = 0; i < BW_ROWS; i++) {
        double raw_bw = (double)r.big / bw[i].t[0] * 1e-9, lib_bw = (double)r.big / bw[i].t[1] * 1e-9;
        bench_table_row(&t, bw[i].label, (double[]){raw_bw, lib_bw, lib_bw / raw_bw});
    }
    bench_table_end(&t);
    for (int i = 0; i < BW_ROWS; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s %s, mapping / driver", bw[i].what, size_name);
        bench_figure(ctx, bw[i].id, bw[i].t[0] / bw[i].t[1], "x", what);
    }

    /* Many small copies: a batch, a mirror sync. */
    double batch[2][2], mirror[2];
    for (int dir = 0; dir < 2; dir++)
        measure(&r, dir, SMALL, 1, raw_batch, lib_batch, batch[dir]);
    measure(&r, 0, SMALL, 0, raw_mirror, lib_mirror, mirror);
    static const char *const many_cols[] = {"driver ms", "mapping ms", "speed ratio"};
    bench_table_begin(ctx, &t, "cuda_raw_many",
                      "Scattered 64-byte copies: driver = one cuMemcpy*Async_v2 each from page-locked memory on one "
                      "stream + synchronize; mapping = one batch (pageable) or one mirror sync, blocking",
                      "work", 3, 3, many_cols);
    bench_table_row(&t, "batch 10k H2D", (double[]){batch[0][0] * 1e3, batch[0][1] * 1e3, batch[0][0] / batch[0][1]});
    bench_table_row(&t, "batch 10k D2H", (double[]){batch[1][0] * 1e3, batch[1][1] * 1e3, batch[1][0] / batch[1][1]});
    bench_table_row(&t, "mirror 1k H2D", (double[]){mirror[0] * 1e3, mirror[1] * 1e3, mirror[0] / mirror[1]});
    bench_table_end(&t);

    bench_note(ctx, "goals: large copies >= 0.95x the driver; 64 B copies within 1 us of it");
    bench_figure(ctx, "cuda_batch_10k_h2d_over_driver", batch[0][0] / batch[0][1], "x",
                 "batch 10k x 64 B H2D, mapping / driver");
    bench_figure(ctx, "cuda_batch_10k_d2h_over_driver", batch[1][0] / batch[1][1], "x",
                 "batch 10k x 64 B D2H, mapping / driver");
    bench_figure(ctx, "cuda_mirror_1k_ranges_over_driver", mirror[0] / mirror[1], "x",
                 "mirror sync 1,000 ranges, mapping / driver");
    rc = 0;
out:
    teardown(&r);
    return rc;
}
