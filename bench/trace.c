/*
 * The cost of tracing: a 64-byte blocking copy with tracing off and on, in
 * the same run. The difference is the cost of one trace event (two clock
 * reads, a lock, a copy into memory); the file is written at the end.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bench.h"

typedef struct trace_job {
    mapping_buffer *buf;
    void           *host;
} trace_job;

static int copy64(void *arg)
{
    trace_job *j = arg;
    return mapping_sync_to_gpu_range(NULL, j->host, j->buf, 0, 64) != MAPPING_OK;
}

BENCH_SECTION(bench_trace, 25, "trace", "cost of a trace event: 64-byte blocking copies with MAPPING_TRACE off and on")
{
    if (mapping_trace_active()) {
        bench_note(ctx, "trace: skipped, a trace is being recorded already (MAPPING_TRACE)");
        return 0;
    }
    /* In a directory of our own (mkdtemp, mode 0700): a name another user
     * could guess in /tmp could be planted as a link or a FIFO. */
    const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/mapping_bench_trace.XXXXXX", tmpdir);
    if (!mkdtemp(dir)) {
        bench_note(ctx, "trace: skipped, no private directory in %s: %s", tmpdir, strerror(errno));
        return 1;
    }
    snprintf(path, sizeof path, "%s/trace.json", dir);
    trace_job j = {NULL, NULL};
    int rc = 1;
    if (bench_check(mapping_allocate_gpu(ctx->dev, 4096, &j.buf), "allocate_gpu") ||
        bench_check(mapping_allocate_cpu(ctx->dev, 4096, &j.host), "allocate_cpu"))
        goto out;
    memset(j.host, 7, 4096);
    /* Tracing on holds every event in memory: at most 1e5 calls per sample. */
    copy64(&j);
    double t0 = bench_now();
    for (int i = 0; i < 1000; i++)
        copy64(&j);
    int reps = bench_reps_for((bench_now() - t0) / 1000, ctx->quick ? 0.002 : 0.01);
    if (reps > 100000)
        reps = 100000;
    double off[64], on[64], diff[64];
    int runs = ctx->runs;
    for (int r = 0; r < runs; r++) {
        off[r] = bench_time(&(bench_ctx){.runs = 1}, reps, copy64, &j);
        if (bench_check(mapping_trace_start(path), "trace_start"))
            goto out;
        on[r] = bench_time(&(bench_ctx){.runs = 1}, reps, copy64, &j);
        if (bench_check(mapping_trace_stop(), "trace_stop"))
            goto out;
        diff[r] = on[r] - off[r];
    }
    double m_off = bench_median(off, runs), m_on = bench_median(on, runs), m_diff = bench_median(diff, runs);
    static const char *const cols[] = {"median ns", "min ns", "max ns"};
    bench_table t;
    bench_table_begin(ctx, &t, "trace", "64-byte blocking copy, tracing off and on (one event per copy)", "case", 1, 3,
                      cols);
    bench_table_row(&t, "tracing off", (double[]){m_off * 1e9, off[0] * 1e9, off[runs - 1] * 1e9});
    bench_table_row(&t, "tracing on", (double[]){m_on * 1e9, on[0] * 1e9, on[runs - 1] * 1e9});
    bench_table_row(&t, "per event", (double[]){m_diff * 1e9, diff[0] * 1e9, diff[runs - 1] * 1e9});
    bench_table_end(&t);
    bench_note(ctx, "per event = median over runs of (on - off), paired in each run; %d copies per sample", reps);
    bench_figure(ctx, "trace_event_ns", m_diff * 1e9, "ns", "cost of one trace event (target <= 1000 ns)");
    rc = 0;
out:
    remove(path);
    rmdir(dir);
    mapping_free_cpu(ctx->dev, j.host);
    mapping_free_gpu(j.buf);
    return rc;
}
