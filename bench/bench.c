#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "bench.h"
#include "bench_args.h"
#include "targets.h"
#include "os/json.h"

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double bench_time(bench_ctx *ctx, int reps, int (*fn)(void *arg), void *arg)
{
    double samples[64];
    int runs = ctx->runs < 64 ? ctx->runs : 64;
    for (int r = 0; r < runs; r++) {
        double t0 = bench_now();
        for (int i = 0; i < reps; i++)
            if (fn(arg) != 0)
                return NAN;
        samples[r] = (bench_now() - t0) / reps;
    }
    double median = bench_median(samples, runs); /* sorts */
    ctx->last_min = samples[0];
    ctx->last_max = samples[runs - 1];
    return median;
}

int bench_reps_for(double seconds_per_call, double target)
{
    if (!(seconds_per_call > 0))
        return 1000;
    double reps = target / seconds_per_call;
    return reps < 1 ? 1 : reps > 1e6 ? 1000000 : (int)reps;
}

int bench_check(mapping_status st, const char *what)
{
    if (st == MAPPING_OK)
        return 0;
    fprintf(stderr, "mapping bench: %s failed: %s (%s)\n", what, mapping_status_string(st),
            mapping_last_error_message());
    return 1;
}

/* ---- JSON accumulation ---- */

static void json_append(bench_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void json_append(bench_ctx *ctx, const char *fmt, ...)
{
    if (!ctx->json)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = ctx->json_cap - ctx->json_len;
        int n = vsnprintf(ctx->json_buf ? ctx->json_buf + ctx->json_len : NULL, room, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < room) {
            ctx->json_len += (size_t)n;
            return;
        }
        size_t cap = ctx->json_cap ? ctx->json_cap * 2 : 4096;
        while (cap - ctx->json_len <= (size_t)n)
            cap *= 2;
        char *buf = realloc(ctx->json_buf, cap);
        if (!buf)
            return;
        ctx->json_buf = buf;
        ctx->json_cap = cap;
    }
}

static void json_string(bench_ctx *ctx, const char *s)
{
    char   small[256];
    size_t n = mapping_json_string(NULL, 0, s);
    char  *q = n < sizeof small ? small : malloc(n + 1);
    if (!q)
        return;
    mapping_json_string(q, n + 1, s);
    json_append(ctx, "%s", q);
    if (q != small)
        free(q);
}

static void json_number(bench_ctx *ctx, double v)
{
    if (isfinite(v))
        json_append(ctx, "%.6g", v);
    else
        json_append(ctx, "null");
}

/* ---- tables ---- */

enum { LABEL_WIDTH = 14, COL_WIDTH = 13 };

void bench_table_begin(bench_ctx *ctx, bench_table *t, const char *id, const char *title, const char *label,
                       int decimals, int ncols, const char *const *cols)
{
    memset(t, 0, sizeof *t);
    t->ctx = ctx;
    t->id = id;
    t->ncols = ncols < 12 ? ncols : 12;
    t->decimals = decimals;
    for (int i = 0; i < t->ncols; i++)
        t->cols[i] = cols[i];
    fprintf(ctx->out, "\n%s\n%-*s", title, LABEL_WIDTH, label);
    for (int i = 0; i < t->ncols; i++)
        fprintf(ctx->out, " %*s", COL_WIDTH, cols[i]);
    fprintf(ctx->out, "\n");
    json_append(ctx, "%s{\"id\":", ctx->json_tables++ ? "," : "");
    json_string(ctx, id);
    json_append(ctx, ",\"title\":");
    json_string(ctx, title);
    json_append(ctx, ",\"columns\":[");
    json_string(ctx, label);
    for (int i = 0; i < t->ncols; i++) {
        json_append(ctx, ",");
        json_string(ctx, cols[i]);
    }
    json_append(ctx, "],\"rows\":[");
}

static void csv_row(bench_table *t, const char *label, size_t bytes, const double *values, const double *lo,
                    const double *hi)
{
    for (int i = 0; i < t->ncols; i++) {
        printf("%s,\"%s\",", t->id, label);
        if (bytes)
            printf("%zu", bytes);
        printf(",\"%s\",", t->cols[i]);
        for (int k = 0; k < 3; k++) {
            double v = k == 0 ? values[i] : !lo ? NAN : k == 1 ? lo[i] : hi[i];
            if (isfinite(v))
                printf("%.6g", v);
            printf(k < 2 ? "," : "\n");
        }
    }
}

void bench_table_row(bench_table *t, const char *label, const double *values)
{
    bench_ctx *ctx = t->ctx;
    if (ctx->csv)
        csv_row(t, label, 0, values, NULL, NULL);
    fprintf(ctx->out, "%-*s", LABEL_WIDTH, label);
    json_append(ctx, "%s[", t->rows++ ? "," : "");
    json_string(ctx, label);
    for (int i = 0; i < t->ncols; i++) {
        if (isfinite(values[i]))
            fprintf(ctx->out, " %*.*f", COL_WIDTH, t->decimals, values[i]);
        else
            fprintf(ctx->out, " %*s", COL_WIDTH, "n/a");
        json_append(ctx, ",");
        json_number(ctx, values[i]);
    }
    fprintf(ctx->out, "\n");
    json_append(ctx, "]");
    fflush(ctx->out);
}

void bench_table_row_range(bench_table *t, const char *label, size_t bytes, const double *values, const double *lo,
                           const double *hi)
{
    int csv = t->ctx->csv;
    t->ctx->csv = 0; /* the CSV row below has the bytes and the range */
    bench_table_row(t, label, values);
    t->ctx->csv = csv;
    if (csv)
        csv_row(t, label, bytes, values, lo, hi);
    if (lo && hi) {
        fprintf(t->ctx->out, "%*s", LABEL_WIDTH, "  min..max");
        for (int i = 0; i < t->ncols; i++) {
            char cell[48];
            if (isfinite(lo[i]) && isfinite(hi[i]))
                snprintf(cell, sizeof cell, "%.*f..%.*f", t->decimals, lo[i], t->decimals, hi[i]);
            else
                snprintf(cell, sizeof cell, "-");
            fprintf(t->ctx->out, " %*s", COL_WIDTH, cell);
        }
        fprintf(t->ctx->out, "\n");
        fflush(t->ctx->out);
    }
    if (t->rows <= 64) {
        int r = t->rows - 1;
        t->sizes[r] = bytes;
        for (int i = 0; i < t->ncols; i++) {
            t->lo[r][i] = lo ? lo[i] : NAN;
            t->hi[r][i] = hi ? hi[i] : NAN;
        }
        t->ranged |= lo && hi;
        t->nsized += bytes > 0;
    }
}

void bench_table_row_sized(bench_table *t, size_t bytes, const double *values, const double *lo, const double *hi)
{
    char label[32];
    bench_table_row_range(t, bench_size_name(bytes, label, sizeof label), bytes, values, lo, hi);
}

void bench_table_end(bench_table *t)
{
    bench_ctx *ctx = t->ctx;
    json_append(ctx, "]");
    int rows = t->rows < 64 ? t->rows : 64;
    if (t->nsized && t->nsized == rows) {
        json_append(ctx, ",\"sizes\":[");
        for (int r = 0; r < rows; r++)
            json_append(ctx, "%s%zu", r ? "," : "", t->sizes[r]);
        json_append(ctx, "]");
    }
    if (t->ranged) {
        json_append(ctx, ",\"ranges\":[");
        for (int r = 0; r < rows; r++) {
            json_append(ctx, "%s[", r ? "," : "");
            for (int i = 0; i < t->ncols; i++) {
                json_append(ctx, "%s[", i ? "," : "");
                json_number(ctx, t->lo[r][i]);
                json_append(ctx, ",");
                json_number(ctx, t->hi[r][i]);
                json_append(ctx, "]");
            }
            json_append(ctx, "]");
        }
        json_append(ctx, "]");
    }
    json_append(ctx, "}");
}

void bench_progress(bench_ctx *ctx, const char *fmt, ...)
{
    double now = bench_now();
    if (now - ctx->progress_last < 0.5)
        return;
    ctx->progress_last = now;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    int tty = isatty(STDERR_FILENO);
    fprintf(stderr, tty ? "\r\033[Kmapping bench: %s: %s" : "mapping bench: %s: %s\n", ctx->section, line);
    fflush(stderr);
}

int bench_sizes(const bench_ctx *ctx, size_t start, size_t end, double factor, size_t *sizes, int max)
{
    if (ctx->size_start) {
        start = ctx->size_start;
        end = ctx->size_end;
        factor = ctx->size_factor;
    }
    int n = 0;
    for (double s = (double)start; s <= (double)end && n < max; s *= factor) {
        size_t bytes = (size_t)s;
        if (n == 0 || bytes > sizes[n - 1])
            sizes[n++] = bytes;
    }
    if (n < max && (n == 0 || sizes[n - 1] != end))
        sizes[n++] = end;
    else if (n == max)
        sizes[max - 1] = end;
    return n;
}

void bench_note(bench_ctx *ctx, const char *fmt, ...)
{
    if (!ctx->explain)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(ctx->out, "  %s\n", line);
}

static char figures_json[16384];
static size_t figures_len;

static void figure(bench_ctx *ctx, const char *id, double value, const char *unit, const char *what, size_t size,
                   size_t full, const char *na_why)
{
    char key[128]; /* ids are short constants; one longer than this would be cut */
    char verdict[384];
    bench_target t;
    bench_target_parse(what, &t);
    bench_target_scale(&t, size, full);
    t.na_why = na_why;
    bench_target_status s = bench_target_check(&t, value);
    bench_target_describe(&t, s, value, unit, verdict, sizeof verdict);
    char desc[256]; /* the description without its "(target ...)" */
    snprintf(desc, sizeof desc, "%.*s%s", (int)t.desc_len, what, t.found ? t.rest : "");
    if (*verdict || ctx->explain) /* without --explain: one line per target (or noise) */
        fprintf(ctx->out, "  => %-44s %12.4g %s%s%s\n", desc, value, unit, *verdict ? "   " : "", verdict);
    mapping_json_string(key, sizeof key, id);
    bench_targets_record(key, value, &t, s);
    if (figures_len < sizeof figures_json - 256)
        figures_len += (size_t)snprintf(figures_json + figures_len, sizeof figures_json - figures_len,
                                        "%s%s:%.6g", ctx->json_figures++ ? "," : "", key,
                                        isfinite(value) ? value : 0.0);
}

void bench_figure_sized(bench_ctx *ctx, const char *id, double value, const char *unit, const char *what, size_t size,
                        size_t full)
{
    figure(ctx, id, value, unit, what, size, full, NULL);
}

void bench_figure(bench_ctx *ctx, const char *id, double value, const char *unit, const char *what)
{
    figure(ctx, id, value, unit, what, 0, 0, NULL);
}

void bench_figure_na(bench_ctx *ctx, const char *id, double value, const char *unit, const char *what,
                     const char *why)
{
    figure(ctx, id, value, unit, what, 0, 0, why);
}

const char *bench_size_name(size_t bytes, char *buf, size_t len)
{
    if (bytes >= (1u << 30) && bytes % (1u << 30) == 0)
        snprintf(buf, len, "%zu GiB", bytes >> 30);
    else if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
        snprintf(buf, len, "%zu MiB", bytes >> 20);
    else if (bytes >= 1024 && bytes % 1024 == 0)
        snprintf(buf, len, "%zu KiB", bytes >> 10);
    else
        snprintf(buf, len, "%zu B", bytes);
    return buf;
}

/* ---- the command ---- */

/* Whether the back end asked for is the built-in host one and unavailable:
 * it has no driver to miss, so only a bad setting of its own
 * (MAPPING_HOST_DEVICES) does that; mapping_open(NULL) then opens it too. */
static bool host_misconfigured(const bench_args *args)
{
    const char *env = getenv("MAPPING_BACKEND");
    const char *named = args->backend ? args->backend : env && *env ? env : NULL;
    mapping_backend_info infos[16];
    int n = 0;
    if ((named && strcmp(named, "host")) || mapping_list_backends(infos, 16, &n) != MAPPING_OK)
        return false;
    for (int i = 0; i < n && i < 16; i++)
        if (!strcmp(infos[i].name, "host"))
            return infos[i].compiled && !infos[i].available;
    return false;
}

/* Opens the device asked for into ctx; returns KEEP_GOING, or the exit status
 * when it cannot (BENCH_EXIT_UNAVAILABLE when the back end is absent). */
static int open_device(const bench_args *args, bench_ctx *ctx)
{
    mapping_status st;
    if (args->device >= 0) {
        mapping_device_desc desc = {.backend = args->backend, .device = args->device};
        st = mapping_open(&desc, &ctx->dev);
    } else {
        /* No --device: $MAPPING_DEVICE applies (mapping_open(NULL)), in the
         * back end of --backend if given. */
        if (args->backend)
            setenv("MAPPING_BACKEND", args->backend, 1);
        st = mapping_open(NULL, &ctx->dev);
    }
    if (st != MAPPING_OK) {
        fprintf(stderr, "mapping bench: cannot open %s: %s\n",
                args->backend ? args->backend : "the default back end", mapping_last_error_message());
        /* A bad setting (MAPPING_HOST_LINK=nan, a MAPPING_TRACE file that
         * cannot be made, MAPPING_DEVICE=5 where the back end has fewer
         * devices, MAPPING_HOST_DEVICES=0 making the built-in host back end
         * unavailable) is a bad command line: exit 2, never 77, which a CI
         * job counts as skipped. (mapping_open says NO_DEVICE only for an
         * index past the devices of a back end that has some.) */
        if (st == MAPPING_ERR_INVALID_ARGUMENT || st == MAPPING_ERR_NO_DEVICE || host_misconfigured(args))
            return 2;
        if (st == MAPPING_ERR_NO_BACKEND) {
            printf("SKIP: %s\n", mapping_last_error_message());
            return BENCH_EXIT_UNAVAILABLE;
        }
        return 1;
    }
    mapping_device_get_info(ctx->dev, &ctx->info);
    return KEEP_GOING;
}

/* The report's opening: a text header, and the JSON document's first keys. */
static void report_begin(bench_ctx *ctx)
{
    fprintf(ctx->out, "mapping bench: back end %s, device %d: %s (%s)\n", ctx->info.backend, ctx->info.index,
            ctx->info.name, ctx->info.driver);
    fprintf(ctx->out, "GB/s = 1e9 bytes/s; every figure is the median of %d runs%s\n", ctx->runs,
            ctx->quick ? " (--quick)" : "");
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    json_append(ctx, "{\"version\":");
    json_string(ctx, mapping_version());
    json_append(ctx, ",\"date\":\"%s\",\"backend\":", date);
    json_string(ctx, ctx->info.backend);
    json_append(ctx, ",\"device\":");
    json_string(ctx, ctx->info.name);
    json_append(ctx, ",\"device_index\":%d,\"kind\":", ctx->info.index);
    json_string(ctx, ctx->info.kind);
    json_append(ctx, ",\"vendor\":");
    json_string(ctx, ctx->info.vendor);
    json_append(ctx, ",\"driver\":");
    json_string(ctx, ctx->info.driver);
    json_append(ctx, ",\"runs\":%d,\"quick\":%s,\"tables\":[", ctx->runs, ctx->quick ? "true" : "false");
    if (ctx->csv)
        printf("table,row,bytes,column,median,min,max\n");
}

/* Closes the JSON document and prints it (with --json). */
static void report_end(bench_ctx *ctx)
{
    char targets[12288];
    bench_targets_json(targets, sizeof targets);
    json_append(ctx, "],\"figures\":{%.*s}%s}", (int)figures_len, figures_json, targets);
    bench_targets_summary(ctx->out, ctx->strict, ctx->explain);
    if (ctx->json && ctx->json_buf)
        printf("%s\n", ctx->json_buf);
    free(ctx->json_buf);
    ctx->json_buf = NULL;
}

int bench_main(int argc, char **argv)
{
    bench_args args = {.device = -1};
    bench_ctx  ctx  = {.runs = 0, .out = stdout};
    bench_sort_sections();
    int status = bench_parse_args(argc, argv, &args, &ctx);
    if (status == KEEP_GOING)
        status = open_device(&args, &ctx);
    if (status != KEEP_GOING)
        return status;
    report_begin(&ctx);
    int failed = bench_run_sections(&ctx, args.only);
    report_end(&ctx);
    mapping_close(ctx.dev);
    if (!failed && ctx.strict && bench_targets_failed())
        return BENCH_EXIT_STRICT;
    return failed;
}
