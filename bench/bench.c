#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"
#include "os/json.h"

static const bench_section *sections[64];
static int section_count;

void bench_register(const bench_section *section)
{
    if (section_count < (int)(sizeof sections / sizeof sections[0]))
        sections[section_count++] = section;
}

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
    return bench_median(samples, runs);
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

void bench_table_row(bench_table *t, const char *label, const double *values)
{
    bench_ctx *ctx = t->ctx;
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

void bench_table_end(bench_table *t)
{
    json_append(t->ctx, "]}");
}

void bench_note(bench_ctx *ctx, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(ctx->out, "  %s\n", line);
}

static char figures_json[16384];
static size_t figures_len;

void bench_figure(bench_ctx *ctx, const char *id, double value, const char *unit, const char *what)
{
    char key[128]; /* ids are short constants; one longer than this would be cut */
    fprintf(ctx->out, "  => %-44s %12.4g %s\n", what, value, unit);
    mapping_json_string(key, sizeof key, id);
    if (figures_len < sizeof figures_json - 256)
        figures_len += (size_t)snprintf(figures_json + figures_len, sizeof figures_json - figures_len,
                                        "%s%s:%.6g", ctx->json_figures++ ? "," : "", key,
                                        isfinite(value) ? value : 0.0);
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

static int compare_sections(const void *a, const void *b)
{
    const bench_section *x = *(const bench_section *const *)a, *y = *(const bench_section *const *)b;
    return (x->order > y->order) - (x->order < y->order);
}

static int wanted(const char *only, const char *name)
{
    if (!only)
        return 1;
    size_t n = strlen(name);
    for (const char *p = only; (p = strstr(p, name)); p += n)
        if ((p == only || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return 1;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mapping bench [--backend NAME] [--device N] [--quick] [--runs N] [--json] [--only S,S]\n"
               "exit status: 0 done, 1 a section failed, 2 bad arguments, %d the back end is not available here\n"
               "sections:\n",
            BENCH_EXIT_UNAVAILABLE);
    for (int i = 0; i < section_count; i++)
        fprintf(f, "  %-12s %s\n", sections[i]->name, sections[i]->help);
}

/* What the command line asks for, besides what bench_ctx holds. */
typedef struct bench_args {
    const char *backend, *only;
    int         device; /* -1: not given */
} bench_args;

/* parse_args, open_device: carry on (any other value is the exit status). */
enum { KEEP_GOING = -1 };

/* Reads argv into args and ctx; returns KEEP_GOING, or the exit status when the
 * command ends here (--help, a bad argument). */
static int parse_args(int argc, char **argv, bench_args *args, bench_ctx *ctx)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--backend") && i + 1 < argc)
            args->backend = argv[++i];
        else if (!strcmp(a, "--device") && i + 1 < argc)
            args->device = atoi(argv[++i]);
        else if (!strcmp(a, "--runs") && i + 1 < argc)
            ctx->runs = atoi(argv[++i]);
        else if (!strcmp(a, "--only") && i + 1 < argc)
            args->only = argv[++i];
        else if (!strcmp(a, "--quick"))
            ctx->quick = 1;
        else if (!strcmp(a, "--json"))
            ctx->json = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "mapping bench: unknown argument %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (ctx->runs <= 0)
        ctx->runs = ctx->quick ? 3 : 7;
    if (ctx->runs > 64)
        ctx->runs = 64;
    if (ctx->json)
        ctx->out = stderr;
    return KEEP_GOING;
}

/* Opens the device asked for into ctx; returns KEEP_GOING, or the exit status
 * when it cannot (BENCH_EXIT_UNAVAILABLE when the back end is absent). */
static int open_device(const bench_args *args, bench_ctx *ctx)
{
    mapping_status st;
    if (args->backend || args->device >= 0) {
        mapping_device_desc desc = {.backend = args->backend, .device = args->device > 0 ? args->device : 0};
        st = mapping_open(&desc, &ctx->dev);
    } else {
        st = mapping_open(NULL, &ctx->dev);
    }
    if (st != MAPPING_OK) {
        fprintf(stderr, "mapping bench: cannot open %s: %s\n",
                args->backend ? args->backend : "the default back end", mapping_last_error_message());
        if (st == MAPPING_ERR_NO_BACKEND || st == MAPPING_ERR_NO_DEVICE) {
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
    json_append(ctx, "{\"backend\":");
    json_string(ctx, ctx->info.backend);
    json_append(ctx, ",\"device\":");
    json_string(ctx, ctx->info.name);
    json_append(ctx, ",\"runs\":%d,\"quick\":%s,\"tables\":[", ctx->runs, ctx->quick ? "true" : "false");
}

/* Runs the sections --only names (all without it), in order; 1 if any failed. */
static int run_sections(bench_ctx *ctx, const char *only)
{
    int failed = 0;
    for (int i = 0; i < section_count; i++)
        if (wanted(only, sections[i]->name) && sections[i]->run(ctx) != 0) {
            fprintf(stderr, "mapping bench: section %s failed\n", sections[i]->name);
            failed = 1;
        }
    return failed;
}

/* Closes the JSON document and prints it (with --json). */
static void report_end(bench_ctx *ctx)
{
    json_append(ctx, "],\"figures\":{%.*s}}", (int)figures_len, figures_json);
    if (ctx->json && ctx->json_buf)
        printf("%s\n", ctx->json_buf);
    free(ctx->json_buf);
    ctx->json_buf = NULL;
}

int bench_main(int argc, char **argv)
{
    bench_args args = {.device = -1};
    bench_ctx  ctx  = {.runs = 0, .out = stdout};
    qsort(sections, (size_t)section_count, sizeof sections[0], compare_sections);
    int status = parse_args(argc, argv, &args, &ctx);
    if (status == KEEP_GOING)
        status = open_device(&args, &ctx);
    if (status != KEEP_GOING)
        return status;
    report_begin(&ctx);
    int failed = run_sections(&ctx, args.only);
    report_end(&ctx);
    mapping_close(ctx.dev);
    return failed;
}
