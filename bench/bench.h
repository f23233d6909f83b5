/*
 * The benchmark framework behind `mapping bench`. A section is a function
 * that measures something on ctx->dev and reports tables of medians through
 * bench_table_*; the same report is printed as text or, with --json, as one
 * JSON document. Sections register themselves with BENCH_SECTION and run in
 * order of their `order` key.
 */
#ifndef MAPPING_BENCH_H
#define MAPPING_BENCH_H

#include <stddef.h>
#include <stdio.h>
#include "mapping.h"

/* Exit status of `mapping bench` when the back end asked for is absent, and
 * with --strict when a figure missed its target or read as noise. */
enum { BENCH_EXIT_UNAVAILABLE = 77, BENCH_EXIT_STRICT = 3 };

typedef struct bench_ctx {
    mapping_device     *dev;
    mapping_device_info info;
    int                 quick; /* fewer sizes and runs */
    int                 strict; /* --strict: a missed target fails the run (BENCH_EXIT_STRICT) */
    int                 explain; /* --explain: the notes under each table and every headline figure */
    int                 runs;  /* runs per figure; the median is reported */
    int                 json;
    FILE               *out;   /* text output (stdout; stderr when --json) */
    char               *json_buf;
    size_t              json_len, json_cap;
    int                 json_tables, json_figures;
    int                 csv;   /* tables as CSV rows on stdout (text to stderr) */
    /* --sizes start,end,factor for size sweeps (0: the section's own). */
    size_t              size_start, size_end;
    double              size_factor;
    unsigned            directions; /* BENCH_DIR_* bits (--direction); all by default */
    const char         *section;    /* the section running, for progress lines */
    double              last_min, last_max; /* of bench_time's last samples (seconds per call) */
    double              progress_last;
} bench_ctx;

/* Directions of --direction. */
enum { BENCH_DIR_H2D = 1, BENCH_DIR_D2H = 2, BENCH_DIR_D2D = 4, BENCH_DIR_BIDIR = 8, BENCH_DIR_ALL = 15 };

typedef struct bench_section {
    const char *name;  /* for --only */
    int         order; /* sections run in increasing order */
    const char *help;
    int (*run)(bench_ctx *ctx); /* 0 = ok; else the run fails */
} bench_section;

/* The registry (sections.c). */
void bench_register(const bench_section *section);
int                  bench_section_count(void);
const bench_section *bench_section_at(int i); /* in run order once bench_main has sorted them */
void                 bench_sort_sections(void); /* by order key; bench_main calls it first */
/* Runs the sections --only names (all without it: NULL), in order; 1 if any
 * failed. */
int                  bench_run_sections(bench_ctx *ctx, const char *only);
#define BENCH_SECTION(ident, order_, name_, help_)                                           \
    static int ident(bench_ctx *ctx);                                                        \
    static const bench_section ident##_section = {name_, order_, help_, ident};              \
    __attribute__((constructor)) static void ident##_register(void)                          \
    {                                                                                        \
        bench_register(&ident##_section);                                                    \
    }                                                                                        \
    static int ident(bench_ctx *ctx)

/* ---- measuring ---- */
double bench_now(void);                 /* seconds, monotonic */
double bench_median(double *v, int n);  /* sorts v */
/* Runs fn(arg) `reps` times per sample, takes ctx->runs samples, and returns
 * the median seconds per call (the fastest and slowest sample go to
 * ctx->last_min and ctx->last_max). */
double bench_time(bench_ctx *ctx, int reps, int (*fn)(void *arg), void *arg);
/* The device-side diff figures of the `tracking` section (tracking_diff.c). */
int bench_device_diff(bench_ctx *ctx);
/* Repetitions so one sample takes about `target` seconds, from one call. */
int    bench_reps_for(double seconds_per_call, double target);
/* Fails the run with a message when st is not MAPPING_OK. */
int    bench_check(mapping_status st, const char *what);

/* ---- reporting ---- */
typedef struct bench_table {
    bench_ctx  *ctx;
    int         ncols;
    const char *cols[12];
    int         decimals;
    int         rows;
    const char *id;
    /* Per row (the first 64): its size (bench_table_row_sized) and min..max. */
    int         nsized, ranged;
    size_t      sizes[64];
    double      lo[64][12], hi[64][12];
} bench_table;

/* id: a stable key for JSON; title: printed above the table; label: the
 * name of the first column. cols: the value columns. */
void bench_table_begin(bench_ctx *ctx, bench_table *t, const char *id, const char *title, const char *label,
                       int decimals, int ncols, const char *const *cols);
/* One row; NaN prints as "n/a" (null in JSON). */
void bench_table_row(bench_table *t, const char *label, const double *values);
void bench_table_end(bench_table *t);
/* A row of a size sweep: the label is the size's name, and the JSON row
 * carries the size in bytes ("sizes") and, when lo and hi are not NULL, the
 * minimum and maximum over runs of each column ("ranges": [[min, max], ...];
 * the text shows them on a line under the medians). */
void bench_table_row_sized(bench_table *t, size_t bytes, const double *values, const double *lo, const double *hi);
/* A row with its min..max over runs (lo, hi; NaN where none), as above;
 * bytes 0 when the row is not a size. */
void bench_table_row_range(bench_table *t, const char *label, size_t bytes, const double *values, const double *lo,
                           const double *hi);
/* Progress on stderr for long sections: at most every half second. */
void bench_progress(bench_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The sizes of a sweep: --sizes, else start..end times factor. Returns the
 * count (at most max); the last size is end. */
int  bench_sizes(const bench_ctx *ctx, size_t start, size_t end, double factor, size_t *sizes, int max);
/* A line of text under a table, explaining it: printed with --explain only. */
void bench_note(bench_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A headline figure: kept in JSON "figures". A target stated in `what`,
 * "(target <= 2)", is checked and shown as information, one line ("target
 * <= 2x: met" / "not met"; JSON "targets"); a value below zero or NaN is
 * reported as noise, never as met (targets.c). A figure without a target
 * (and not noise) is printed with --explain only. */
void bench_figure(bench_ctx *ctx, const char *id, double value, const char *unit, const char *what);
/* A figure whose target does not apply to this device (the device diff's
 * `auto` declines on a device whose memory is the CPU's, by design): shown
 * as "target <= 0.02: n/a (why)", recorded as "n/a" in JSON, never counted
 * as a miss (nor by --strict). */
void bench_figure_na(bench_ctx *ctx, const char *id, double value, const char *unit, const char *what,
                     const char *why);
/* The same, for a target that grows with the size of the run (a ratio
 * against a copy of the whole buffer) and is stated for `full` bytes: on a
 * run of `size` bytes (--quick shrinks them) it is scaled by size / full,
 * and the report says so. */
void bench_figure_sized(bench_ctx *ctx, const char *id, double value, const char *unit, const char *what, size_t size,
                        size_t full);

/* Human size, "64 KiB". */
const char *bench_size_name(size_t bytes, char *buf, size_t len);

#endif
