/*
 * Pipelines: a large array through a step whose compute time equals its
 * transfer time, serial (blocking upload, compute, blocking download, one
 * chunk after another) against pipelined (depth 2 and 3), in the same run. On the host
 * back end with the link modelled at 25 GB/s and 5 us, so copies take the
 * time they would over PCIe and the overlap shows on a CPU.
 *
 * The step is a modelled kernel: it holds its stream for the chunk's
 * upload time measured in the same run through the same array, as a device kernel would, without using a CPU core
 * (the modelled link's copies already use the CPU's memcpy).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"

typedef struct kernel {
    double seconds_per_byte; /* measured upload time per byte of a chunk */
} kernel;

typedef struct kernel_run {
    double seconds;
} kernel_run;

static void sleep_for(void *arg)
{
    const kernel_run *k = arg;
    double end = bench_now() + k->seconds;
    for (;;) {
        double left = end - bench_now();
        if (left <= 0)
            return;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* The pipeline runs at most 2 x depth chunks ahead: a ring that long holds
 * each queued kernel's argument until it has run. */
enum { RING = 2 * 3 };
typedef struct step_state {
    kernel     k;
    kernel_run runs[RING];
} step_state;

static mapping_status modelled_step(mapping_stream *stream, const mapping_pipeline_chunk *chunk, void *user)
{
    step_state *s = user;
    kernel_run *run = &s->runs[chunk->index % RING];
    run->seconds = s->k.seconds_per_byte * (double)chunk->bytes;
    return mapping_launch_host(stream, sleep_for, run);
}

typedef struct pipe_job {
    mapping_pipeline *p;
    void             *in, *out;
    size_t            bytes;
    step_state        step;
} pipe_job;

static int run_pipeline(void *arg)
{
    pipe_job *j = arg;
    return mapping_pipeline_run(j->p, j->in, j->out, j->bytes, modelled_step, &j->step) != MAPPING_OK;
}

/* The baseline a user writes without a pipeline: blocking calls, chunk by
 * chunk, on the caller's thread. */
typedef struct serial_job {
    mapping_buffer *in, *out;
    pipe_job       *j;
    size_t          chunk;
} serial_job;

static int run_serial(void *arg)
{
    serial_job *s = arg;
    for (size_t off = 0; off < s->j->bytes; off += s->chunk) {
        size_t n = s->j->bytes - off < s->chunk ? s->j->bytes - off : s->chunk;
        kernel_run k = {s->j->step.k.seconds_per_byte * (double)n};
        if (mapping_sync_to_gpu_range(NULL, (char *)s->j->in + off, s->in, 0, n) != MAPPING_OK)
            return 1;
        sleep_for(&k);
        if (mapping_sync_to_cpu_range(NULL, s->out, 0, (char *)s->j->out + off, n) != MAPPING_OK)
            return 1;
    }
    return 0;
}

static double measure_serial(bench_ctx *ctx, mapping_device *dev, size_t chunk, pipe_job *j)
{
    serial_job s = {NULL, NULL, j, chunk};
    double t = NAN;
    if (!bench_check(mapping_allocate_gpu(dev, chunk, &s.in), "allocate_gpu") &&
        !bench_check(mapping_allocate_gpu(dev, chunk, &s.out), "allocate_gpu") && run_serial(&s) == 0)
        t = bench_time(ctx, 1, run_serial, &s);
    mapping_free_gpu(s.in);
    mapping_free_gpu(s.out);
    return t;
}

static double measure(bench_ctx *ctx, mapping_device *dev, int depth, size_t chunk, pipe_job *j)
{
    mapping_pipeline_desc desc = {.chunk_bytes = chunk, .depth = depth};
    if (bench_check(mapping_pipeline_create(dev, &desc, &j->p), "pipeline_create"))
        return NAN;
    double t = run_pipeline(j) == 0 ? bench_time(ctx, 1, run_pipeline, j) : NAN;
    mapping_pipeline_destroy(j->p);
    return t;
}

/* Blocking upload time per byte, chunk by chunk through the whole array (as
 * the pipeline reads it: not from cache), median of three passes. */
static double upload_seconds_per_byte(mapping_device *dev, const char *host, size_t bytes, size_t chunk)
{
    mapping_buffer *buf;
    if (bench_check(mapping_allocate_gpu(dev, chunk, &buf), "allocate_gpu"))
        return NAN;
    double t[3];
    for (int i = 0; i < 3; i++) {
        double t0 = bench_now();
        for (size_t off = 0; off < bytes; off += chunk)
            mapping_sync_to_gpu_range(NULL, host + off, buf, 0, bytes - off < chunk ? bytes - off : chunk);
        t[i] = (bench_now() - t0) / (double)bytes;
    }
    mapping_free_gpu(buf);
    return bench_median(t, 3);
}

/* One link scenario: a row of the table. Returns 0 on success. */
static int scenario(bench_ctx *ctx, bench_table *t, double bandwidth, size_t bytes, double ratios[2])
{
    mapping_device *dev = NULL;
    mapping_device_desc desc = {.backend = "host", .link_bandwidth = bandwidth, .link_latency = 5e-6};
    pipe_job j = {.bytes = bytes};
    int rc = 1;
    mapping_pipeline *probe = NULL;
    if (bench_check(mapping_open(&desc, &dev), "open host with link model") ||
        bench_check(mapping_allocate_cpu(dev, bytes, &j.in), "allocate_cpu") ||
        bench_check(mapping_allocate_cpu(dev, bytes, &j.out), "allocate_cpu") ||
        bench_check(mapping_pipeline_create(dev, NULL, &probe), "pipeline_create"))
        goto out;
    memset(j.in, 1, bytes);
    memset(j.out, 2, bytes);
    /* The chunk the pipeline picks by default from the device's link, with
     * enough chunks that filling and draining the pipe costs little. */
    mapping_pipeline_desc used;
    mapping_pipeline_get_desc(probe, &used);
    size_t chunk = used.chunk_bytes;
    while (chunk > bytes / 16)
        chunk /= 2;
    j.step.k.seconds_per_byte = upload_seconds_per_byte(dev, j.in, bytes, chunk);
    double serial = measure_serial(ctx, dev, chunk, &j);
    double one = measure(ctx, dev, 1, chunk, &j), two = measure(ctx, dev, 2, chunk, &j);
    double three = measure(ctx, dev, 3, chunk, &j);
    double v[9] = {(double)chunk / (1 << 20), j.step.k.seconds_per_byte * (double)chunk * 1e3,
                   (5e-6 + (double)chunk / bandwidth) * 1e3, serial * 1e3, one * 1e3, two * 1e3, three * 1e3,
                   two / serial, three / serial};
    char label[48], size_name[32];
    snprintf(label, sizeof label, "%g GB/s %s", bandwidth * 1e-9, bench_size_name(bytes, size_name, sizeof size_name));
    bench_table_row(t, label, v);
    ratios[0] = v[7];
    ratios[1] = v[8];
    rc = 0;
out:
    mapping_pipeline_destroy(probe);
    mapping_free_cpu(dev, j.in);
    mapping_free_cpu(dev, j.out);
    mapping_close(dev);
    return rc;
}

BENCH_SECTION(bench_pipeline, 50, "pipeline",
              "1 GiB through a step with compute time = transfer time: serial vs pipelined (host link model)")
{
    static const char *const cols[] = {"chunk MiB", "up ms", "model ms", "serial ms", "depth 1 ms",
                                       "depth 2 ms", "depth 3 ms", "d2/serial", "d3/serial"};
    bench_table t;
    bench_table_begin(ctx, &t, "pipeline",
                      "Pipeline: page-locked array up, through a modelled kernel (time = measured upload time), "
                      "and down; host back end, link modelled at 5 us and the bandwidth shown",
                      "link, size", 3, 9, cols);
    double r25[2] = {NAN, NAN}, r4[2] = {NAN, NAN};
    if (scenario(ctx, &t, 25e9, ctx->quick ? (size_t)64 << 20 : (size_t)1 << 30, r25) ||
        scenario(ctx, &t, 4e9, ctx->quick ? (size_t)32 << 20 : (size_t)256 << 20, r4))
        return 1;
    bench_table_end(&t);
    bench_note(ctx, "up ms = one chunk's blocking upload measured through the array; model ms = latency + "
                    "bytes / bandwidth. Where up > model, the memcpy behind each modelled copy is the limit, "
                    "and the upload and download memcpys share the CPUs and memory bandwidth.");
    bench_note(ctx, "serial = blocking upload, kernel, blocking download per chunk on the calling thread; "
                    "depth 1 = the pipeline with one stream (no overlap).");
    bench_note(ctx, "ideal: depth 3 = 1/3 of serial (upload, compute, download overlapped), depth 2 = 1/2.%s",
               ctx->quick ? " --quick: 64 MiB and 32 MiB instead of 1 GiB and 256 MiB." : "");
    bench_figure(ctx, "pipeline_depth3_over_serial", r25[1], "x", "25 GB/s: pipelined (depth 3) / serial time");
    bench_figure(ctx, "pipeline_depth2_over_serial", r25[0], "x", "25 GB/s: pipelined (depth 2) / serial time");
    bench_figure(ctx, "pipeline_4GBps_depth3_over_serial", r4[1], "x", "4 GB/s: pipelined (depth 3) / serial time");
    return 0;
}
