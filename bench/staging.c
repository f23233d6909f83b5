/*
 * Pageable against page-locked memory for one large copy on a stream (256
 * MiB; 64 MiB with --quick): mapping_sync_to_gpu_range / _to_cpu_range on a
 * stream, then a synchronize, from malloc'ed memory and from
 * mapping_allocate_cpu memory. On CUDA a pageable copy goes through the
 * staging arena in pieces, the caller packing piece i+1 while piece i is on
 * the link (src/backend/cuda/cuda_staging.c); a copy staged whole did one
 * memcpy of all of it before its one DMA began. With copy threads
 * (MAPPING_COPY_THREADS, os/copy_pool.c) several cores pack or unpack each
 * piece: one core copies 7-10 GB/s where an H200's link moves 55. Target: the pageable copy
 * reaches >= 0.8x the page-locked one, on every back end that stages (the
 * fake driver, a GPU; the host back end's link model).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bench.h"

typedef struct staging_job {
    mapping_stream *stream;
    mapping_buffer *buf;
    void           *host;
    size_t          bytes;
    int             to_gpu;
} staging_job;

static int run_copy(void *arg)
{
    staging_job *j = arg;
    mapping_status st = j->to_gpu ? mapping_sync_to_gpu_range(j->stream, j->host, j->buf, 0, j->bytes)
                                  : mapping_sync_to_cpu_range(j->stream, j->buf, 0, j->host, j->bytes);
    if (st == MAPPING_OK)
        st = mapping_stream_synchronize(j->stream);
    return bench_check(st, j->to_gpu ? "a stream copy to the device" : "a stream copy to the CPU");
}

BENCH_SECTION(bench_staging, 48, "staging",
              "one large copy on a stream from pageable memory against page-locked memory (256 MiB)")
{
    const size_t full = (size_t)256 << 20, bytes = ctx->quick ? (size_t)64 << 20 : full;
    staging_job j = {.bytes = bytes};
    void *pinned = NULL;
    unsigned char *pageable = malloc(bytes);
    int rc = 1;
    if (!pageable || bench_check(mapping_allocate_gpu(ctx->dev, bytes, &j.buf), "mapping_allocate_gpu") ||
        bench_check(mapping_allocate_cpu(ctx->dev, bytes, &pinned), "mapping_allocate_cpu") ||
        bench_check(mapping_stream_create(ctx->dev, &j.stream), "mapping_stream_create"))
        goto out;
    memset(pageable, 1, bytes);
    memset(pinned, 1, bytes);

    static const char *const cols[] = {"pageable GB/s", "page-locked GB/s", "pageable / page-locked"};
    bench_table t;
    char title[128], size[32];
    snprintf(title, sizeof title, "One %s copy on a stream, then a synchronize", bench_size_name(bytes, size, sizeof size));
    bench_table_begin(ctx, &t, "staging", title, "direction", 2, 3, cols);
    double ratio[2] = {0, 0};
    for (int dir = 0; dir < 2; dir++) {
        j.to_gpu = dir == 0;
        if (!(ctx->directions & (j.to_gpu ? BENCH_DIR_H2D : BENCH_DIR_D2H)))
            continue;
        j.host = pageable;
        double t_pageable = bench_time(ctx, 1, run_copy, &j);
        j.host = pinned;
        double t_pinned = bench_time(ctx, 1, run_copy, &j);
        if (t_pageable <= 0 || t_pinned <= 0)
            goto out;
        ratio[dir] = t_pinned / t_pageable;
        double row[3] = {(double)bytes / t_pageable / 1e9, (double)bytes / t_pinned / 1e9, ratio[dir]};
        bench_table_row(&t, j.to_gpu ? "H2D" : "D2H", row);
    }
    bench_table_end(&t);
    const char *threads = getenv("MAPPING_COPY_THREADS");
    bench_note(ctx,
               "copy threads (packing and unpacking pieces of 2 MiB or more on a GPU): MAPPING_COPY_THREADS=%s (unset: "
               "half of this machine's %ld CPUs less one, at most 5)",
               threads && *threads ? threads : "unset", sysconf(_SC_NPROCESSORS_ONLN));
    if (ctx->directions & BENCH_DIR_H2D)
        bench_figure(ctx, "staging_h2d_pageable_over_pinned", ratio[0], "x",
                     "H2D stream copy, pageable / page-locked speed (target >= 0.8)");
    if (ctx->directions & BENCH_DIR_D2H)
        bench_figure(ctx, "staging_d2h_pageable_over_pinned", ratio[1], "x",
                     "D2H stream copy, pageable / page-locked speed (target >= 0.8)");
    rc = 0;
out:
    if (j.stream)
        mapping_stream_destroy(j.stream);
    if (pinned)
        mapping_free_cpu(ctx->dev, pinned);
    if (j.buf)
        mapping_free_gpu(j.buf);
    free(pageable);
    return rc;
}
