/*
 * Peer copies: mapping_copy_peer of one large block from a buffer of one
 * device to a buffer of another, against what an expert writes for the same
 * copy in the same run: memcpy between the two buffers' memory on the host
 * back end (its virtual devices: MAPPING_HOST_DEVICES=2), a raw
 * clEnqueueCopyBuffer + clFinish on the destination's queue on OpenCL (PoCL
 * exposes two devices with POCL_DEVICES="pthread pthread"). Samples of the
 * two are interleaved. With one device, the second is another object of
 * device 0 (the same path: the host's memcpy, OpenCL's shared context).
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define BENCH_PEER_CL 1
#define CL_TARGET_OPENCL_VERSION 120
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>
#endif
#endif

typedef struct peer_job {
    mapping_buffer *src, *dst;
    size_t          bytes;
    void           *native_src, *native_dst; /* host: addresses; OpenCL: cl_mem */
    void           *queue;                   /* OpenCL: the destination's cl_command_queue */
#ifdef BENCH_PEER_CL
    __typeof__(&clEnqueueCopyBuffer) copy_buffer;
    __typeof__(&clFinish)            finish;
#endif
} peer_job;

static int run_library(void *arg)
{
    peer_job *j = arg;
    return bench_check(mapping_copy_peer(NULL, j->src, 0, j->dst, 0, j->bytes), "mapping_copy_peer");
}

static int run_memcpy(void *arg)
{
    peer_job *j = arg;
    memcpy(j->native_dst, j->native_src, j->bytes);
    return 0;
}

#ifdef BENCH_PEER_CL
static int run_cl(void *arg)
{
    peer_job *j = arg;
    cl_int err = j->copy_buffer(j->queue, j->native_src, j->native_dst, 0, 0, j->bytes, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = j->finish(j->queue);
    return err == CL_SUCCESS ? 0 : 1;
}

static int load_cl(peer_job *j)
{
    const char *env = getenv("MAPPING_OPENCL_LIBRARY");
    void *lib = dlopen(env && *env ? env : "libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 1;
    void *a = dlsym(lib, "clEnqueueCopyBuffer"), *b = dlsym(lib, "clFinish");
    if (!a || !b)
        return 1;
    memcpy(&j->copy_buffer, &a, sizeof a);
    memcpy(&j->finish, &b, sizeof b);
    return 0;
}
#endif

/* A multimirror on two devices (k = 2): device 0 modifies 1000 scattered
 * ranges of a 64 MiB array (16 MiB with --quick), device 1 syncs. The bytes moved (peer and host
 * copies into device 1) against the bytes modified, and the time. */
static int bench_multimirror(bench_ctx *ctx, mapping_device *other)
{
    const size_t n = (size_t)(ctx->quick ? 16 : 64) << 20, ranges = 1000;
    mapping_device *devs[2] = {ctx->dev, other};
    mapping_multimirror *m;
    if (bench_check(mapping_multimirror_create(devs, 2, n, &m), "mapping_multimirror_create"))
        return 1;
    int failed = bench_check(mapping_multimirror_mark_cpu_modified(m, 0, n), "mark") ||
                 bench_check(mapping_multimirror_sync_to_gpu(NULL, m, 0), "sync") ||
                 bench_check(mapping_multimirror_sync_to_gpu(NULL, m, 1), "sync");
    double t[64];
    int runs = ctx->runs < 64 ? ctx->runs : 64;
    uint64_t modified = 0, moved = 0;
    for (int r = 0; r < runs && !failed; r++) {
        modified = 0;
        for (size_t i = 0; i < ranges && !failed; i++) {
            size_t len = 64 + (i * 97) % 4000, off = i * (n / ranges) + (i * 31 + (size_t)r) % 1000;
            failed = bench_check(mapping_fill_gpu(NULL, mapping_multimirror_gpu(m, 0), off, len, (unsigned char)r),
                                 "mapping_fill_gpu") ||
                     bench_check(mapping_multimirror_mark_gpu_modified(m, 0, off, len), "mark");
            modified += len;
        }
        mapping_stats before, after;
        mapping_device_stats(other, &before);
        double t0 = bench_now();
        failed = failed || bench_check(mapping_multimirror_sync_to_gpu(NULL, m, 1), "mapping_multimirror_sync_to_gpu");
        t[r] = bench_now() - t0;
        mapping_device_stats(other, &after);
        moved = (after.peer_bytes - before.peer_bytes) + (after.h2d_bytes - before.h2d_bytes);
        failed = failed || bench_check(mapping_multimirror_sync_to_cpu(m), "mapping_multimirror_sync_to_cpu");
    }
    if (!failed) {
        bench_table tb;
        const char *cols[] = {"modified KiB", "moved KiB", "moved/modified", "sync ms"};
        bench_table_begin(ctx, &tb, "multimirror_k2", "Multimirror, k = 2: device 0 modifies 1000 ranges, device 1 syncs",
                          "array", 3, 4, cols);
        double v[4] = {modified / 1024.0, moved / 1024.0, (double)moved / (double)modified,
                       bench_median(t, runs) * 1e3};
        char size[32];
        bench_table_row(&tb, bench_size_name(n, size, sizeof size), v);
        bench_table_end(&tb);
    }
    mapping_multimirror_destroy(m);
    return failed;
}

BENCH_SECTION(bench_peer, 60, "peer", "peer copy between two devices, 256 MiB, against memcpy / clEnqueueCopyBuffer")
{
    const char *backend = ctx->info.backend;
    mapping_device_info infos[2];
    int count = 0;
    if (bench_check(mapping_list_devices(backend, infos, 2, &count), "mapping_list_devices"))
        return 1;
    mapping_device *other = NULL;
    mapping_device_desc desc = {.backend = backend, .device = count >= 2 ? 1 : 0};
    if (bench_check(mapping_open(&desc, &other), "mapping_open (second device)"))
        return 1;
    peer_job j = {.bytes = (size_t)(ctx->quick ? 32 : 256) << 20};
    int (*baseline)(void *) = NULL;
    const char *baseline_name = "n/a";
    int failed = bench_check(mapping_allocate_gpu(ctx->dev, j.bytes, &j.src), "mapping_allocate_gpu") ||
                 bench_check(mapping_allocate_gpu(other, j.bytes, &j.dst), "mapping_allocate_gpu") ||
                 bench_check(mapping_fill_gpu(NULL, j.src, 0, j.bytes, 0x3c), "mapping_fill_gpu") ||
                 bench_check(mapping_fill_gpu(NULL, j.dst, 0, j.bytes, 0), "mapping_fill_gpu") ||
                 bench_check(mapping_buffer_native(j.src, &j.native_src), "mapping_buffer_native") ||
                 bench_check(mapping_buffer_native(j.dst, &j.native_dst), "mapping_buffer_native");
    if (!failed && strcmp(backend, "host") == 0) {
        baseline = run_memcpy;
        baseline_name = "memcpy";
    }
#ifdef BENCH_PEER_CL
    mapping_native_device nd;
    if (!failed && strcmp(backend, "opencl") == 0 && mapping_device_native(other, &nd) == MAPPING_OK &&
        load_cl(&j) == 0) {
        j.queue = nd.queue;
        baseline = run_cl;
        baseline_name = "clEnqueueCopyBuffer";
    }
#endif
    if (!failed) {
        double t_lib[64], t_base[64];
        int runs = ctx->runs < 64 ? ctx->runs : 64;
        run_library(&j); /* warm: first touch, page faults */
        if (baseline)
            baseline(&j);
        for (int r = 0; r < runs && !failed; r++) {
            double t0 = bench_now();
            failed = run_library(&j);
            t_lib[r] = bench_now() - t0;
            t0 = bench_now();
            t_base[r] = baseline && !baseline(&j) ? bench_now() - t0 : NAN;
        }
        if (!failed) {
            double lib = bench_median(t_lib, runs), base = baseline ? bench_median(t_base, runs) : NAN;
            char size[32];
            bench_table t;
            const char *cols[] = {"library GB/s", "baseline GB/s", "ratio"};
            bench_table_begin(ctx, &t, "peer_copy", "Peer copy between two devices (median)", "copy", 2, 3, cols);
            double v[3] = {j.bytes / lib / 1e9, j.bytes / base / 1e9, base / lib};
            char label[96];
            snprintf(label, sizeof label, "%s, device 0 -> %d, vs %s", bench_size_name(j.bytes, size, sizeof size),
                     desc.device, baseline_name);
            bench_table_row(&t, label, v);
            bench_table_end(&t);
            if (count < 2)
                bench_note(ctx, "peer: %s has one device here; the second is another object of device 0 "
                           "(host: MAPPING_HOST_DEVICES=2; PoCL: POCL_DEVICES=\"pthread pthread\")", backend);
            if (baseline)
                bench_figure(ctx, "peer_copy_vs_baseline", base / lib, "x",
                             "peer copy speed relative to the baseline (1 = as fast)");
        }
    }
    mapping_free_gpu(j.src);
    mapping_free_gpu(j.dst);
    if (!failed)
        failed = bench_multimirror(ctx, other);
    mapping_close(other);
    return failed;
}
