/* The targets of `mapping bench` figures (targets.c): a figure's description
 * may state one, "(target <= 2)", "(target >= 10000)", "(target 0)". Each is
 * reported as information beside its figure; --strict makes a miss fail. */
#ifndef MAPPING_BENCH_TARGETS_H
#define MAPPING_BENCH_TARGETS_H

#include <stddef.h>
#include <stdio.h>

typedef enum bench_target_status {
    BENCH_TARGET_NONE,   /* the description states no target */
    BENCH_TARGET_MET,
    BENCH_TARGET_MISSED,
    BENCH_TARGET_NOISE,  /* an impossible reading (below zero, or none): not checked, not a pass */
    BENCH_TARGET_NA,     /* the target does not apply to this device (na_why says why): neither met nor missed */
} bench_target_status;

typedef struct bench_target {
    int    found;
    char   op[3];        /* "<=", ">=", "<", ">", "==" */
    double stated;       /* as the description states it */
    double value;        /* what the figure is checked against (stated, scaled) */
    size_t size, full;   /* scaled from `full` bytes to `size` bytes (0: not scaled) */
    size_t desc_len;     /* the description's length without " (target ...)" */
    const char *rest;    /* what follows the target's closing parenthesis */
    const char *na_why;  /* not NULL: the target does not apply here, and why (bench_figure_na) */
} bench_target;

/* Reads the target from a figure's description; t->found = 0 when none. */
void bench_target_parse(const char *what, bench_target *t);
/* A target that grows with the size of the run (a ratio against a copy of
 * the whole buffer), stated for `full` bytes, on a run of `size` bytes:
 * scaled by size / full. Nothing when either is 0. */
void bench_target_scale(bench_target *t, size_t size, size_t full);
/* Met, missed, or noise: a value below zero or NaN cannot be a reading of
 * a time, a byte count or a ratio, with or without a target. n/a (before
 * all of these) when a stated target has na_why. */
bench_target_status bench_target_check(const bench_target *t, double value);
/* "target <= 2x: met", "target <= 0.02: n/a (why)", "noise: ...": what the
 * text report prints after the figure's value. */
void bench_target_describe(const bench_target *t, bench_target_status s, double value, const char *unit, char *buf,
                           size_t len);

/* The report's record of every target, for JSON and the closing summary. */
void bench_targets_record(const char *json_key, double value, const bench_target *t, bench_target_status s);
/* Appends ,"targets":[...],"missed_targets":[...] (JSON) to buf; returns its length. */
size_t bench_targets_json(char *buf, size_t len);
/* The closing line of the text report (nothing when no figure had a target
 * or noise); with explain, what targets are. */
void bench_targets_summary(FILE *out, int strict, int explain);
/* How many targets were missed or not checked for noise (what --strict
 * fails on; noise on a figure without a target does not count). */
int bench_targets_failed(void);
/* Forgets every record (for a second report in one process). */
void bench_targets_reset(void);

#endif
