/*
 * Host memory the library did not allocate, on CUDA: one large copy on a
 * stream (256 MiB; 32 MiB with --quick), then a synchronize, against the
 * same copy from mapping_allocate_cpu memory:
 * - from page-locked memory another library allocated (cuMemHostAlloc
 *   through the driver, as torch.Tensor.pin_memory does): recognised and
 *   copied directly (target >= 0.95x);
 * - from pageable memory registered in place
 *   (mapping_device_set_host_registration), once registered (target >=
 *   0.8x);
 * - what registering costs, in seconds per GiB: the first copy of fresh
 *   memory less a copy of it once registered, with 4 KiB pages
 *   (MADV_NOHUGEPAGE) and with 2 MiB pages asked for (MADV_HUGEPAGE;
 *   transparent huge pages, where the kernel gives them).
 * The driver is opened as the back end opens it ($MAPPING_CUDA_LIBRARY,
 * libcuda.so.1, libcuda.so), in the device's primary context.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "bench.h"

typedef struct host_driver {
    int (*ctx_push)(void *);
    int (*ctx_pop)(void **);
    int (*host_alloc)(void **, size_t, unsigned);
    int (*host_free)(void *);
} host_driver;

static int load_driver(host_driver *cu)
{
    const char *env = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = env && *env ? dlopen(env, RTLD_NOW | RTLD_LOCAL) : dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib && !(env && *env))
        lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    void *s[4] = {lib ? dlsym(lib, "cuCtxPushCurrent_v2") : NULL, lib ? dlsym(lib, "cuCtxPopCurrent_v2") : NULL,
                  lib ? dlsym(lib, "cuMemHostAlloc") : NULL, lib ? dlsym(lib, "cuMemFreeHost") : NULL};
    if (!s[0] || !s[1] || !s[2] || !s[3])
        return 0;
    memcpy(&cu->ctx_push, &s[0], sizeof s[0]);
    memcpy(&cu->ctx_pop, &s[1], sizeof s[1]);
    memcpy(&cu->host_alloc, &s[2], sizeof s[2]);
    memcpy(&cu->host_free, &s[3], sizeof s[3]);
    return 1;
}

typedef struct host_job {
    mapping_stream *stream;
    mapping_buffer *buf;
    void           *host;
    size_t          bytes;
    int             to_gpu;
} host_job;

static int stream_copy(void *arg)
{
    host_job *j = arg;
    mapping_status st = j->to_gpu ? mapping_sync_to_gpu_range(j->stream, j->host, j->buf, 0, j->bytes)
                                  : mapping_sync_to_cpu_range(j->stream, j->buf, 0, j->host, j->bytes);
    if (st == MAPPING_OK)
        st = mapping_stream_synchronize(j->stream);
    return bench_check(st, "a stream copy");
}

/* Fresh anonymous memory at a 2 MiB boundary, touched, with 4 KiB or (asked
 * for) 2 MiB pages; *base is the mapping of bytes + 2 MiB to unmap. */
static void *fresh(size_t bytes, int huge, void **base)
{
    size_t align = (size_t)2 << 20;
    char *p = mmap(NULL, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    *base = p;
    char *a = (char *)(((uintptr_t)p + align - 1) / align * align);
    (void)madvise(a, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    memset(a, 1, bytes);
    return a;
}

/* Seconds per GiB that registering costs: the first copy of fresh memory
 * less the next one (registered by then); NaN when either fails. */
static double register_cost(bench_ctx *ctx, host_job *j, int huge)
{
    void *base = NULL, *p = fresh(j->bytes, huge, &base);
    if (!p)
        return NAN;
    j->host = p;
    j->to_gpu = 1;
    double t0 = bench_now();
    int bad = stream_copy(j);
    double first = bench_now() - t0;
    double warm = bad ? NAN : bench_time(ctx, 1, stream_copy, j);
    mapping_host_registration_forget(ctx->dev, p, j->bytes);
    munmap(base, j->bytes + ((size_t)2 << 20));
    return bad ? NAN : (first - warm) / ((double)j->bytes / (double)(1u << 30));
}

typedef struct host_times {
    double locked[2], foreign[2], registered[2], cost4k, cost2m;
} host_times;

static void measure(bench_ctx *ctx, host_job *j, void *locked, void *foreign, void *pageable, host_times *t)
{
    for (int dir = 0; dir < 2; dir++) {
        j->to_gpu = dir == 0;
        j->host = locked;
        t->locked[dir] = bench_time(ctx, 1, stream_copy, j);
        j->host = foreign;
        t->foreign[dir] = bench_time(ctx, 1, stream_copy, j);
        j->host = pageable;
        stream_copy(j); /* registers it */
        t->registered[dir] = bench_time(ctx, 1, stream_copy, j);
    }
    mapping_host_registration_forget(ctx->dev, pageable, j->bytes);
    t->cost4k = register_cost(ctx, j, 0);
    t->cost2m = register_cost(ctx, j, 1);
}

static void report(bench_ctx *ctx, const host_job *j, const host_times *t)
{
    static const char *const cols[] = {"GB/s", "/ page-locked"};
    char title[160], size[32];
    snprintf(title, sizeof title, "One %s copy on a stream, then a synchronize, by where the host memory comes from",
             bench_size_name(j->bytes, size, sizeof size));
    bench_table tab;
    bench_table_begin(ctx, &tab, "cuda_host", title, "host memory", 2, 2, cols);
    const char *names[3] = {"page-locked (mapping)", "page-locked elsewhere", "pageable, registered"};
    const double *rows[3] = {t->locked, t->foreign, t->registered};
    for (int dir = 0; dir < 2; dir++)
        for (int i = 0; i < 3; i++) {
            char label[64];
            snprintf(label, sizeof label, "%s %s", dir ? "D2H" : "H2D", names[i]);
            bench_table_row(&tab, label,
                            (double[]){(double)j->bytes / rows[i][dir] * 1e-9, t->locked[dir] / rows[i][dir]});
        }
    bench_table_end(&tab);
    bench_note(ctx, "page-locked elsewhere: cuMemHostAlloc through the driver, as torch.Tensor.pin_memory; pageable, "
                    "registered: mapping_device_set_host_registration, after its first copy");
    bench_figure(ctx, "cuda_h2d_foreign_locked_over_locked", t->locked[0] / t->foreign[0], "x",
                 "H2D stream copy, page-locked elsewhere / page-locked (target >= 0.95)");
    bench_figure(ctx, "cuda_d2h_foreign_locked_over_locked", t->locked[1] / t->foreign[1], "x",
                 "D2H stream copy, page-locked elsewhere / page-locked (target >= 0.95)");
    bench_figure(ctx, "cuda_h2d_registered_over_locked", t->locked[0] / t->registered[0], "x",
                 "H2D stream copy, pageable registered in place / page-locked (target >= 0.8)");
    bench_figure(ctx, "cuda_d2h_registered_over_locked", t->locked[1] / t->registered[1], "x",
                 "D2H stream copy, pageable registered in place / page-locked (target >= 0.8)");
    bench_figure(ctx, "cuda_register_s_per_gib_4k", t->cost4k, "s/GiB", "registration in place, 4 KiB pages");
    bench_figure(ctx, "cuda_register_s_per_gib_2m", t->cost2m, "s/GiB",
                 "registration in place, 2 MiB pages asked for (MADV_HUGEPAGE)");
}

BENCH_SECTION(bench_cuda_host, 91, "cuda-host",
              "cuda only: one large stream copy from page-locked memory made elsewhere (as torch's pin_memory) and "
              "from pageable memory registered in place, against mapping_allocate_cpu memory")
{
    if (strcmp(ctx->info.backend, "cuda") != 0) {
        fprintf(ctx->out, "\ncuda-host: skipped (the device's back end is %s, not cuda)\n", ctx->info.backend);
        return 0;
    }
    host_driver cu;
    mapping_native_device native;
    if (!load_driver(&cu) || bench_check(mapping_device_native(ctx->dev, &native), "native handles")) {
        fprintf(ctx->out, "\ncuda-host: skipped (the driver's cuMemHostAlloc cannot be reached)\n");
        return 0;
    }
    host_job j = {.bytes = ctx->quick ? (size_t)32 << 20 : (size_t)256 << 20};
    void *locked = NULL, *foreign = NULL, *popped = NULL, *pageable = malloc(j.bytes);
    int rc = 1;
    if (!pageable || bench_check(mapping_allocate_gpu(ctx->dev, j.bytes, &j.buf), "mapping_allocate_gpu") ||
        bench_check(mapping_allocate_cpu(ctx->dev, j.bytes, &locked), "mapping_allocate_cpu") ||
        bench_check(mapping_stream_create(ctx->dev, &j.stream), "mapping_stream_create") ||
        bench_check(mapping_device_set_host_registration(ctx->dev, (size_t)1 << 20, 3 * j.bytes),
                    "mapping_device_set_host_registration"))
        goto out;
    if (cu.ctx_push(native.context) != 0 || cu.host_alloc(&foreign, j.bytes, 0) != 0) {
        fprintf(stderr, "mapping bench: cuda-host: cuMemHostAlloc of %zu bytes failed\n", j.bytes);
        foreign = NULL;
    }
    cu.ctx_pop(&popped);
    if (!foreign)
        goto out;
    memset(pageable, 1, j.bytes);
    memset(locked, 1, j.bytes);
    memset(foreign, 1, j.bytes);
    host_times t;
    measure(ctx, &j, locked, foreign, pageable, &t);
    report(ctx, &j, &t);
    rc = 0;
out:
    mapping_device_set_host_registration(ctx->dev, 0, 0);
    if (foreign && cu.ctx_push(native.context) == 0) {
        cu.host_free(foreign);
        cu.ctx_pop(&popped);
    }
    if (j.stream)
        mapping_stream_destroy(j.stream);
    if (locked)
        mapping_free_cpu(ctx->dev, locked);
    if (j.buf)
        mapping_free_gpu(j.buf);
    free(pageable);
    return rc;
}
