/* The command line of `mapping bench`: getopt_long, and every value checked
 * (a bad one exits 2 with a message, before anything runs). */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include "bench.h"
#include "bench_args.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: mapping bench [--backend NAME] [--device N] [--quick] [--runs N] [--only S,S]\n"
               "                     [--sizes START,END,FACTOR] [--direction h2d,d2h,d2d,bidir] [--json | --csv]\n"
               "                     [--strict] [--explain]\n"
               "  --sizes     the bandwidth sweep, in bytes (K, M, G: KiB, MiB, GiB), e.g. 4K,256M,4\n"
               "  --runs      runs per figure, 1 to 64 (the median is reported, with min and max)\n"
               "  --json      the report as JSON on stdout (scripts/plot_bench.py plots it); --csv: CSV\n"
               "  --strict    a figure that misses its target (or reads as noise) fails the run (for CI);\n"
               "              without it, targets are information\n"
               "  --explain   the notes that explain each table, and every headline figure (without it:\n"
               "              the tables and one line per target: met, not met, or n/a and why)\n"
               "exit status: 0 done, 1 a section failed, 2 bad arguments (or a bad MAPPING_* setting),\n"
               "             %d --strict and a target missed, %d the back end is not available here\n"
               "sections:\n",
            BENCH_EXIT_STRICT, BENCH_EXIT_UNAVAILABLE);
    for (int i = 0; i < bench_section_count(); i++)
        fprintf(f, "  %-12s %s\n", bench_section_at(i)->name, bench_section_at(i)->help);
}

static int bad_argument(const char *fmt, const char *value)
{
    fprintf(stderr, "mapping bench: ");
    fprintf(stderr, fmt, value);
    fprintf(stderr, " (mapping bench --help)\n");
    return 2;
}

/* The back end that --device counts in: --backend, else $MAPPING_BACKEND,
 * else the one mapping_open(NULL) picks (opened and closed to learn it). */
static int device_backend(const bench_args *args, char *name, size_t len)
{
    const char *env = getenv("MAPPING_BACKEND");
    if (args->backend || (env && *env)) {
        snprintf(name, len, "%s", args->backend ? args->backend : env);
        return 0;
    }
    mapping_device *dev;
    if (mapping_open(&(mapping_device_desc){0}, &dev) != MAPPING_OK)
        return -1;
    snprintf(name, len, "%s", mapping_backend_name(dev));
    mapping_close(dev);
    return 0;
}

/* --device N where the back end has devices but not N is a bad command line
 * (exit 2, with the valid range); a back end without any device is
 * unavailable here, and the open says so (exit 77). */
static int check_device_index(const bench_args *args)
{
    char name[32], text[160];
    int count = 0;
    if (device_backend(args, name, sizeof name) != 0 || mapping_list_devices(name, NULL, 0, &count) != MAPPING_OK ||
        count == 0 || args->device < count)
        return KEEP_GOING;
    snprintf(text, sizeof text, "%d: back end %s has %d device%s (valid: 0..%d)", args->device, name, count,
             count == 1 ? "" : "s", count - 1);
    return bad_argument("--device %s", text);
}

/* A whole decimal integer in [min, max]. */
static int parse_int(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* A size in bytes: a whole number with an optional K, M or G (binary). */
static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno || *s == '-')
        return -1;
    unsigned shift = 0;
    if (*end == 'K' || *end == 'k')
        shift = 10;
    else if (*end == 'M' || *end == 'm')
        shift = 20;
    else if (*end == 'G' || *end == 'g')
        shift = 30;
    if (shift)
        end++;
    if (*end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B')
        end++;
    if (*end || v == 0 || v > (1ull << 40) >> shift)
        return -1;
    *out = (size_t)(v << shift);
    return 0;
}

/* A comma-separated list that fits in cap bytes, with no empty field
 * (strtok would skip ",," and a leading or trailing comma silently). */
static bool list_well_formed(const char *arg, size_t cap)
{
    size_t n = strlen(arg);
    return n > 0 && n < cap && arg[0] != ',' && arg[n - 1] != ',' && !strstr(arg, ",,");
}

/* 0, -1 when malformed, -2 when the factor does not grow START by a whole
 * byte per step (1.0000000000000002 times 1 KiB stays 1 KiB in a double:
 * the sweep would never end). With START * FACTOR >= START + 1 every step
 * adds a byte or more, so the sweep (at most 64 sizes) ends. */
static int parse_sizes(const char *arg, bench_ctx *ctx)
{
    char buf[128], *a, *b, *c, *end;
    if (!list_well_formed(arg, sizeof buf))
        return -1;
    snprintf(buf, sizeof buf, "%s", arg);
    if (!(a = strtok(buf, ",")) || !(b = strtok(NULL, ",")) || !(c = strtok(NULL, ",")) || strtok(NULL, ","))
        return -1;
    double factor = strtod(c, &end);
    if (*end || !(factor > 1) || factor > 1024 || parse_size(a, &ctx->size_start) || parse_size(b, &ctx->size_end) ||
        ctx->size_start > ctx->size_end)
        return -1;
    double start = (double)ctx->size_start;
    if (ctx->size_start < ctx->size_end && !(start * factor >= start + 1))
        return -2;
    ctx->size_factor = factor;
    return 0;
}

static int parse_directions(const char *arg, unsigned *out)
{
    static const char *const names[] = {"h2d", "d2h", "d2d", "bidir"};
    char buf[128];
    *out = 0;
    if (!list_well_formed(arg, sizeof buf))
        return -1;
    snprintf(buf, sizeof buf, "%s", arg);
    for (char *w = strtok(buf, ","); w; w = strtok(NULL, ",")) {
        int k = 0;
        while (k < 4 && strcmp(w, names[k]))
            k++;
        if (k == 4)
            return -1;
        *out |= 1u << k;
    }
    return *out ? 0 : -1;
}

/* Every name in the comma-separated list is a section. */
static const char *unknown_section(const char *only)
{
    static char word[64];
    char buf[512];
    if (!list_well_formed(only, sizeof buf))
        return "";
    snprintf(buf, sizeof buf, "%s", only);
    for (char *w = strtok(buf, ","); w; w = strtok(NULL, ",")) {
        int found = 0;
        for (int i = 0; i < bench_section_count() && !found; i++)
            found = !strcmp(w, bench_section_at(i)->name);
        if (!found) {
            snprintf(word, sizeof word, "%s", w);
            return word;
        }
    }
    return NULL;
}

int bench_parse_args(int argc, char **argv, bench_args *args, bench_ctx *ctx)
{
    enum { OPT_SIZES = 256, OPT_DIRECTION, OPT_CSV, OPT_VERSION, OPT_STRICT, OPT_EXPLAIN };
    static const struct option options[] = {
        {"backend", required_argument, NULL, 'b'}, {"device", required_argument, NULL, 'd'},
        {"runs", required_argument, NULL, 'r'},    {"only", required_argument, NULL, 'o'},
        {"quick", no_argument, NULL, 'q'},         {"json", no_argument, NULL, 'j'},
        {"csv", no_argument, NULL, OPT_CSV},       {"sizes", required_argument, NULL, OPT_SIZES},
        {"direction", required_argument, NULL, OPT_DIRECTION},
        {"version", no_argument, NULL, OPT_VERSION}, {"help", no_argument, NULL, 'h'},
        {"strict", no_argument, NULL, OPT_STRICT}, {"explain", no_argument, NULL, OPT_EXPLAIN},
        {NULL, 0, NULL, 0}};
    long v;
    const char *bad;
    int         bad_sizes;
    opterr = 0;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "+h", options, NULL)) != -1;) {
        const char *a = optarg;
        switch (c) {
        case 'b': args->backend = a; break;
        case 'd':
            if (parse_int(a, 0, 1 << 20, &v))
                return bad_argument("--device %s: not a device index (a whole number >= 0)", a);
            args->device = (int)v;
            break;
        case 'r':
            if (parse_int(a, 1, 64, &v))
                return bad_argument("--runs %s: not a whole number from 1 to 64", a);
            ctx->runs = (int)v;
            break;
        case 'o':
            if ((bad = unknown_section(a)))
                return bad_argument("--only: no section named '%s'", bad);
            args->only = a;
            break;
        case 'q': ctx->quick = 1; break;
        case 'j': ctx->json = 1; break;
        case OPT_CSV: ctx->csv = 1; break;
        case OPT_STRICT: ctx->strict = 1; break;
        case OPT_EXPLAIN: ctx->explain = 1; break;
        case OPT_SIZES:
            if ((bad_sizes = parse_sizes(a, ctx)) == -2)
                return bad_argument("--sizes %s: the factor does not grow START by a byte per step (use at least "
                                    "1 + 1/START)",
                                    a);
            if (bad_sizes)
                return bad_argument("--sizes %s: expected START,END,FACTOR with 0 < START <= END (bytes; K, M, G "
                                    "suffixes) and a factor above 1",
                                    a);
            break;
        case OPT_DIRECTION:
            if (parse_directions(a, &ctx->directions))
                return bad_argument("--direction %s: expected a comma-separated list of h2d, d2h, d2d, bidir", a);
            break;
        case OPT_VERSION: printf("mapping %s\n", mapping_version()); return 0;
        case 'h': usage(stdout); return 0;
        default:
            /* A long option without its value sets optopt to its code ('r'
             * for --runs): name it as written, not as a short option. */
            if (optopt && optopt < 256 && optopt != '?' && strncmp(argv[optind - 1], "--", 2))
                fprintf(stderr, "mapping bench: option -%c is unknown or lacks its value\n", optopt);
            else
                fprintf(stderr, "mapping bench: %s is unknown or lacks its value\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc)
        return bad_argument("unexpected argument '%s'", argv[optind]);
    if (ctx->json && ctx->csv)
        return bad_argument("%s: choose one of --json and --csv", "--json --csv");
    if (!ctx->directions)
        ctx->directions = BENCH_DIR_ALL;
    if (ctx->runs <= 0)
        ctx->runs = ctx->quick ? 3 : 7;
    if (ctx->json || ctx->csv)
        ctx->out = stderr;
    /* A back end this library knows of, or exit 2 (not 77, "skipped"): a
     * misspelt name, on the command line or in $MAPPING_BACKEND, must fail
     * a CI job, not skip it. */
    const char *env_backend = getenv("MAPPING_BACKEND");
    const char *named = args->backend ? args->backend : env_backend && *env_backend ? env_backend : NULL;
    if (named) {
        mapping_backend_info infos[16];
        int n = 0, known = 0;
        mapping_list_backends(infos, 16, &n);
        for (int i = 0; i < n && i < 16; i++)
            known |= !strcmp(infos[i].name, named);
        if (!known)
            return bad_argument(args->backend ? "--backend %s: unknown back end (mapping info lists them)"
                                              : "MAPPING_BACKEND=%s: unknown back end (mapping info lists them)",
                                named);
    }
    return args->device > 0 ? check_device_index(args) : KEEP_GOING;
}

