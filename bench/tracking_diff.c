/*
 * Device-side diff (MAPPING_MIRROR_DEVICE_DIFF), part of the `tracking`
 * section, on the device benchmarked: a 256 MiB mirror (--quick: 32 MiB)
 * whose device side changes in 1 % of its 4 KiB blocks (chosen at random,
 * 64 bytes each) before each sync to the CPU. Against the same mirror
 * without the flag in the same run (a full read-back of the acquired range)
 * and against a full read-back on the PCIe-like link model (25 GB/s, 5 us).
 * Targets: bytes moved <= 2 % of the mirror; time below the modelled full
 * read-back. $MAPPING_DEVICE_DIFF decides as in any program: `auto` diffs
 * only where its measured compare rate beats the device's link (on a CPU
 * device it usually does not), `on` forces it: run the section both ways.
 * Where `auto` declined (the flagged mirror moved every stale byte, as the
 * plain one did), the two targets are about a diff that did not run: they
 * are reported as n/a, with why, not as missed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"

typedef struct diff_run {
    mapping_mirror *m;
    size_t          size;
    uint64_t        seed;
    double          seconds, bytes;
} diff_run;

static uint64_t d2h_bytes(mapping_device *dev)
{
    mapping_stats s;
    return mapping_device_stats(dev, &s) == MAPPING_OK ? s.d2h_bytes : 0;
}

/* One round: the device changes 1 % of the blocks, then a timed sync. */
static int change_and_sync(diff_run *r, double *seconds)
{
    mapping_buffer *buf;
    size_t blocks = r->size / MAPPING_DIFF_BLOCK_BYTES, changed = blocks / 100 ? blocks / 100 : 1;
    if (bench_check(mapping_mirror_acquire_gpu(NULL, r->m, MAPPING_READ | MAPPING_WRITE, &buf), "acquire"))
        return 1;
    for (size_t k = 0; k < changed; k++) {
        r->seed = r->seed * 6364136223846793005u + 1442695040888963407u;
        size_t b = (size_t)(r->seed >> 33) % blocks;
        if (bench_check(mapping_fill_gpu(NULL, buf, b * MAPPING_DIFF_BLOCK_BYTES + 64, 64, (unsigned char)(r->seed >> 24)),
                        "fill"))
            return 1;
    }
    if (bench_check(mapping_mirror_release_gpu(NULL, r->m), "release"))
        return 1;
    double t0 = bench_now();
    if (bench_check(mapping_mirror_sync_to_cpu(NULL, r->m), "sync to the CPU"))
        return 1;
    *seconds = bench_now() - t0;
    return 0;
}

static int measure(bench_ctx *ctx, diff_run *r)
{
    double t[32];
    int runs = ctx->runs < 32 ? ctx->runs : 32;
    if (runs < 3)
        runs = 3;
    double first;
    if (change_and_sync(r, &first)) /* warms up; in auto mode the first diff measures the device */
        return 1;
    uint64_t before = d2h_bytes(ctx->dev);
    for (int i = 0; i < runs; i++)
        if (change_and_sync(r, &t[i]))
            return 1;
    r->bytes = (double)(d2h_bytes(ctx->dev) - before) / runs;
    r->seconds = bench_median(t, runs);
    return 0;
}

int bench_device_diff(bench_ctx *ctx)
{
    size_t full = (size_t)256 << 20, size = ctx->quick ? (size_t)32 << 20 : full;
    const char *env = getenv("MAPPING_DEVICE_DIFF");
    diff_run d = {.size = size, .seed = 7}, f = {.size = size, .seed = 7};
    int rc = 1;
    if (bench_check(mapping_mirror_create(ctx->dev, size, MAPPING_MIRROR_DEVICE_DIFF, &d.m), "diff mirror") ||
        bench_check(mapping_mirror_create(ctx->dev, size, 0, &f.m), "mirror") ||
        bench_check(mapping_mirror_sync_to_gpu(NULL, d.m), "sync") ||
        bench_check(mapping_mirror_sync_to_gpu(NULL, f.m), "sync") || measure(ctx, &f) || measure(ctx, &d))
        goto done;
    double model = (double)size / 25e9 + 5e-6;
    bench_table t;
    static const char *const cols[] = {"ms", "MiB moved", "% of mirror"};
    char title[128], sz[32];
    snprintf(title, sizeof title, "device-side diff, 1 %% of %s changed on the device, MAPPING_DEVICE_DIFF=%s",
             bench_size_name(size, sz, sizeof sz), env && *env ? env : "auto");
    bench_table_begin(ctx, &t, "device_diff", title, "sync to the CPU", 3, 3, cols);
    bench_table_row(&t, "with the diff flag", (double[]){d.seconds * 1e3, d.bytes / 1048576, 100 * d.bytes / (double)size});
    bench_table_row(&t, "full read-back (no flag)", (double[]){f.seconds * 1e3, f.bytes / 1048576, 100 * f.bytes / (double)size});
    bench_table_row(&t, "full read-back, 25 GB/s link model", (double[]){model * 1e3, (double)size / 1048576, 100});
    bench_table_end(&t);
    /* auto declined: the flagged mirror read back as much as the plain one. */
    const char *na = (!env || !*env || !strcmp(env, "auto")) && d.bytes >= 0.99 * f.bytes
                         ? "auto declines the diff on this device, by design: comparing costs more than reading "
                           "back; MAPPING_DEVICE_DIFF=on measures it"
                         : NULL;
    /* A fraction of the mirror: the same target at any size. */
    bench_figure_na(ctx, "device_diff_bytes_fraction", d.bytes / (double)size, "",
                    "device diff: bytes moved / mirror, 1 % of blocks changed (target <= 0.02)", na);
    bench_figure(ctx, "device_diff_vs_full_readback", d.seconds / f.seconds, "x",
                 "device diff / full read-back on this device, same run");
    bench_figure_na(ctx, "device_diff_vs_link_model_readback", d.seconds / model, "x",
                    "device diff / full read-back at 25 GB/s + 5 us (target < 1)", na);
    rc = 0;
done:
    mapping_mirror_destroy(d.m);
    mapping_mirror_destroy(f.m);
    return rc;
}
