/*
 * Pipelines: a large array through a step whose compute time equals its
 * transfer time, serial (blocking upload, compute, blocking download, one
 * chunk after another) against pipelined (depth 1, 2 and 3), in the same
 * run. On the host back end with the link modelled at 25 GB/s and 5 us, so
 * copies take the time they would over PCIe and the overlap shows on a CPU.
 *
 * The step is a modelled kernel: it sleeps (it does not spin) for the
 * chunk's upload time measured in the same run through the same array, as a
 * device kernel takes time without using a CPU core. Kernels run on one
 * "compute engine" with a timeline, so kernels of different streams never
 * overlap (one device, busy with one kernel at a time) and follow each other
 * back to back, as on a GPU, rather than one host thread's wake-up after
 * another. The modelled link's copies are real memcpys on the CPU.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include "bench.h"

typedef struct kernel {
    double          seconds_per_byte; /* measured upload time per byte of a chunk */
    pthread_mutex_t engine;           /* guards busy_until */
    double          busy_until;       /* when the compute engine's last kernel ends */
} kernel;

typedef struct kernel_run {
    kernel *k;
    double  seconds;
} kernel_run;

static void sleep_until(double end)
{
    for (;;) {
        double left = end - bench_now();
        if (left <= 0)
            return;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* One compute engine with a timeline, as a GPU runs kernels: a kernel starts
 * when its stream reaches it and the engine is free, and runs for exactly
 * its time; the next kernel starts when it ends, not when some thread wakes
 * up (a host thread's wake-up latency, tens of microseconds here, would
 * otherwise be added to every kernel). The stream goes on when its kernel
 * has ended. */
static void run_kernel(void *arg)
{
    const kernel_run *run = arg;
    kernel *k = run->k;
    pthread_mutex_lock(&k->engine);
    double now = bench_now(), start = k->busy_until > now ? k->busy_until : now;
    k->busy_until = start + run->seconds;
    double end = k->busy_until;
    pthread_mutex_unlock(&k->engine);
    sleep_until(end);
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
    *run = (kernel_run){&s->k, s->k.seconds_per_byte * (double)chunk->bytes};
    return mapping_launch_host(stream, run_kernel, run);
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
        kernel_run k = {&s->j->step.k, s->j->step.k.seconds_per_byte * (double)n};
        if (mapping_sync_to_gpu_range(NULL, (char *)s->j->in + off, s->in, 0, n) != MAPPING_OK)
            return 1;
        run_kernel(&k);
        if (mapping_sync_to_cpu_range(NULL, s->out, 0, (char *)s->j->out + off, n) != MAPPING_OK)
            return 1;
    }
    return 0;
}

/* CPU time of the whole process (all threads), seconds. */
static double cpu_seconds(void)
{
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u) != 0)
        return NAN;
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

enum { VARIANTS = 4 }; /* serial, depth 1, 2, 3 */

typedef struct variant_times {
    double wall[VARIANTS];  /* median seconds */
    double cpu[VARIANTS];   /* median CPU seconds of the process during a run */
    double ratio[VARIANTS]; /* median over rounds of variant / serial in the same round */
} variant_times;

/* Times serial and depth 1..3 in rounds, one sample of each per round, so
 * that load from other processes that comes and goes hits all of them alike;
 * ratios are taken within a round. */
static int measure_all(bench_ctx *ctx, mapping_device *dev, size_t chunk, pipe_job *j, variant_times *out)
{
    serial_job s = {NULL, NULL, j, chunk};
    mapping_pipeline *p[VARIANTS] = {NULL};
    int rc = 1, runs = ctx->runs < 64 ? ctx->runs : 64;
    double wall[VARIANTS][64], cpu[VARIANTS][64], ratio[VARIANTS][64];
    if (bench_check(mapping_allocate_gpu(dev, chunk, &s.in), "allocate_gpu") ||
        bench_check(mapping_allocate_gpu(dev, chunk, &s.out), "allocate_gpu"))
        goto out;
    for (int d = 1; d < VARIANTS; d++) {
        mapping_pipeline_desc desc = {.chunk_bytes = chunk, .depth = d};
        if (bench_check(mapping_pipeline_create(dev, &desc, &p[d]), "pipeline_create"))
            goto out;
    }
    /* One warm-up of each, so first-touch costs stay out of the samples. */
    if (run_serial(&s) != 0)
        goto out;
    for (int d = 1; d < VARIANTS; d++) {
        j->p = p[d];
        if (run_pipeline(j) != 0)
            goto out;
    }
    for (int r = 0; r < runs; r++) {
        for (int v = 0; v < VARIANTS; v++) {
            j->p = p[v];
            double t0 = bench_now(), c0 = cpu_seconds();
            if ((v ? run_pipeline(j) : run_serial(&s)) != 0)
                goto out;
            wall[v][r] = bench_now() - t0;
            cpu[v][r] = cpu_seconds() - c0;
            ratio[v][r] = wall[v][r] / wall[0][r];
        }
    }
    for (int v = 0; v < VARIANTS; v++) {
        out->wall[v] = bench_median(wall[v], runs);
        out->cpu[v] = bench_median(cpu[v], runs);
        out->ratio[v] = bench_median(ratio[v], runs);
    }
    rc = 0;
out:
    for (int d = 1; d < VARIANTS; d++)
        mapping_pipeline_destroy(p[d]);
    mapping_free_gpu(s.in);
    mapping_free_gpu(s.out);
    return rc;
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

typedef struct scenario_result {
    double d2_over_serial, d3_over_serial;
    double serial_cpu_ms, d3_cpu_ms, d3_ms;
} scenario_result;

/* One link scenario: a row of the table. Returns 0 on success. On the host
 * back end a modelled link of `bandwidth` (a device of its own); elsewhere
 * (bandwidth 0) the chosen device and its real link. */
static int scenario(bench_ctx *ctx, bench_table *t, double bandwidth, size_t bytes, scenario_result *res)
{
    mapping_device *dev = NULL;
    mapping_device_desc desc = {.backend = "host", .link_bandwidth = bandwidth, .link_latency = 5e-6};
    mapping_link link = {5e-6, bandwidth};
    pipe_job j = {.bytes = bytes};
    int rc = 1;
    mapping_pipeline *probe = NULL;
    pthread_mutex_init(&j.step.k.engine, NULL);
    if (bandwidth > 0 ? bench_check(mapping_open(&desc, &dev), "open host with link model")
                      : (dev = ctx->dev, bench_check(mapping_device_link(dev, &link), "device_link")))
        goto out;
    if (
        bench_check(mapping_allocate_cpu(dev, bytes, &j.in), "allocate_cpu") ||
        bench_check(mapping_allocate_cpu(dev, bytes, &j.out), "allocate_cpu") ||
        bench_check(mapping_pipeline_create(dev, NULL, &probe), "pipeline_create"))
        goto out;
    memset(j.in, 1, bytes);
    memset(j.out, 2, bytes);
    /* The chunk the pipeline picks by default for this device, with enough
     * chunks that filling and draining the pipe costs little. */
    mapping_pipeline_desc used;
    mapping_pipeline_get_desc(probe, &used);
    size_t chunk = used.chunk_bytes;
    while (chunk > bytes / 16)
        chunk /= 2;
    j.step.k.seconds_per_byte = upload_seconds_per_byte(dev, j.in, bytes, chunk);
    variant_times m;
    if (measure_all(ctx, dev, chunk, &j, &m))
        goto out;
    double v[9] = {(double)chunk / (1 << 20), j.step.k.seconds_per_byte * (double)chunk * 1e3,
                   (link.latency + (double)chunk / link.bandwidth) * 1e3, m.wall[0] * 1e3, m.wall[1] * 1e3, m.wall[2] * 1e3,
                   m.wall[3] * 1e3, m.ratio[2], m.ratio[3]};
    char label[64], size_name[32];
    snprintf(label, sizeof label, "%s%s %s", bandwidth > 0 ? "" : ctx->info.backend,
             bandwidth > 0 ? "" : " link", bench_size_name(bytes, size_name, sizeof size_name));
    if (bandwidth > 0)
        snprintf(label, sizeof label, "%g GB/s %s", bandwidth * 1e-9, size_name);
    bench_table_row(t, label, v);
    *res = (scenario_result){m.ratio[2], m.ratio[3], m.cpu[0] * 1e3, m.cpu[3] * 1e3, m.wall[3] * 1e3};
    rc = 0;
out:
    mapping_pipeline_destroy(probe);
    mapping_free_cpu(dev, j.in);
    mapping_free_cpu(dev, j.out);
    if (dev != ctx->dev)
        mapping_close(dev);
    pthread_mutex_destroy(&j.step.k.engine);
    return rc;
}

BENCH_SECTION(bench_pipeline, 50, "pipeline",
              "1 GiB through a step with compute time = transfer time: serial vs pipelined (host link model)")
{
    static const char *const cols[] = {"chunk MiB", "up ms", "model ms", "serial ms", "depth 1 ms",
                                       "depth 2 ms", "depth 3 ms", "d2/serial", "d3/serial"};
#ifdef __linux__
    /* Sleeps (the modelled kernel, the link model's wait) end within 1 us of
     * their deadline instead of the default 50 us of timer slack, on this
     * thread and the stream threads it creates: serial and pipelined alike. */
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
    bench_table t;
    const int host = strcmp(ctx->info.backend, "host") == 0;
    char title[256];
    snprintf(title, sizeof title,
             "Pipeline: page-locked array up, through a modelled kernel (time = measured upload time), and down; %s",
             host ? "host back end, link modelled at 5 us and the bandwidth shown"
                  : "on the chosen device, over its real link (model ms = its measured latency + chunk / bandwidth)");
    bench_table_begin(ctx, &t, "pipeline", title, "link, size", 3, 9, cols);
    scenario_result r25 = {NAN, NAN, NAN, NAN, NAN}, r4 = r25;
    bench_progress(ctx, "first scenario");
    int failed = host ? scenario(ctx, &t, 25e9, ctx->quick ? (size_t)64 << 20 : (size_t)1 << 30, &r25) ||
                            (bench_progress(ctx, "second scenario"),
                             scenario(ctx, &t, 4e9, ctx->quick ? (size_t)32 << 20 : (size_t)256 << 20, &r4))
                      : scenario(ctx, &t, 0, ctx->quick ? (size_t)64 << 20 : (size_t)256 << 20, &r25);
#ifdef __linux__
    if (slack > 0)
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
#endif
    if (failed)
        return 1;
    bench_table_end(&t);
    bench_note(ctx, "up ms = one chunk's blocking upload measured through the array; model ms = latency + "
                    "bytes / bandwidth. Where up > model, the memcpy behind each modelled copy is the limit, "
                    "and the upload and download memcpys share the CPUs and memory bandwidth.");
    bench_note(ctx, "the kernel is a sleep, not a CPU spin (a GPU kernel does not use the CPU), for up ms per chunk, "
                    "one kernel at a time on a compute-engine timeline (back to back, as on a GPU); the link model "
                    "sleeps too. serial = blocking upload, kernel, blocking "
                    "download per chunk on the calling thread; depth 1 = the pipeline with one stream (no overlap).");
    bench_note(ctx, "rounds of serial, depth 1, 2, 3; times are medians, ratios the median of each round's ratio.");
    bench_note(ctx, "CPU time per run (all threads), first row: serial %.0f ms, depth 3 %.0f ms = %.2f cores busy "
                    "for %.0f ms. The memcpys need one core each: with a single free core, depth 3 cannot go "
                    "below about (up + down) / (2 up + down) of serial, ~0.64.",
               r25.serial_cpu_ms, r25.d3_cpu_ms, r25.d3_cpu_ms / r25.d3_ms, r25.d3_ms);
    bench_note(ctx, "ideal: depth 3 = 1/3 of serial (upload, compute, download overlapped), depth 2 = 1/2.%s",
               !ctx->quick ? "" : host ? " --quick: 64 MiB and 32 MiB instead of 1 GiB and 256 MiB."
                                       : " --quick: 64 MiB instead of 256 MiB.");
    bench_figure(ctx, "pipeline_depth3_over_serial", r25.d3_over_serial, "x",
                 host ? "25 GB/s: pipelined (depth 3) / serial time" : "pipelined (depth 3) / serial time");
    bench_figure(ctx, "pipeline_depth2_over_serial", r25.d2_over_serial, "x",
                 host ? "25 GB/s: pipelined (depth 2) / serial time" : "pipelined (depth 2) / serial time");
    if (host)
        bench_figure(ctx, "pipeline_4GBps_depth3_over_serial", r4.d3_over_serial, "x",
                     "4 GB/s: pipelined (depth 3) / serial time");
    return 0;
}
