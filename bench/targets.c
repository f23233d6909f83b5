/*
 * The targets of `mapping bench` figures, as information: "target <= 2x:
 * met", "not met", or "n/a (why)" where the target does not apply to the
 * device (bench_figure_na), beside the figure, a count at the end, and the
 * exit status only with --strict (which n/a never fails). A target is a goal for a full-size run on a
 * quiet machine; a first run on a laptop that misses one has not failed.
 * A reading that cannot be (a cost below zero: the noise of a difference of
 * two timings) is reported as noise and never passes.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"
#include "targets.h"
#include "os/json.h"

void bench_target_parse(const char *what, bench_target *t)
{
    memset(t, 0, sizeof *t);
    t->desc_len = strlen(what);
    const char *open = strstr(what, "(target ");
    if (!open)
        return;
    const char *p = open + 8;
    static const char *const ops[] = {"<=", ">=", "<", ">", "=="};
    snprintf(t->op, sizeof t->op, "==");
    for (int i = 0; i < 5; i++)
        if (!strncmp(p, ops[i], strlen(ops[i]))) {
            snprintf(t->op, sizeof t->op, "%s", ops[i]);
            p += strlen(ops[i]);
            break;
        }
    char *end;
    double v = strtod(p, &end);
    if (end == p || !isfinite(v))
        return;
    const char *close = strchr(end, ')');
    t->found = 1;
    t->stated = t->value = v;
    t->desc_len = (size_t)(open - what);
    while (t->desc_len > 0 && what[t->desc_len - 1] == ' ')
        t->desc_len--;
    t->rest = close ? close + 1 : "";
}

void bench_target_scale(bench_target *t, size_t size, size_t full)
{
    if (!t->found || !size || !full || size == full)
        return;
    t->size = size;
    t->full = full;
    t->value = t->stated * ((double)size / (double)full);
}

bench_target_status bench_target_check(const bench_target *t, double value)
{
    if (t->found && t->na_why)
        return BENCH_TARGET_NA;
    if (isnan(value) || value < 0)
        return BENCH_TARGET_NOISE;
    if (!t->found)
        return BENCH_TARGET_NONE;
    const char *op = t->op;
    double x = t->value;
    int met = !strcmp(op, "<=") ? value <= x : !strcmp(op, ">=") ? value >= x : !strcmp(op, "<") ? value < x
              : !strcmp(op, ">") ? value > x : value == x;
    return met ? BENCH_TARGET_MET : BENCH_TARGET_MISSED;
}

/* "<= 2x", "< 100 ns", "0 B". */
static void target_text(const char *op, double v, const char *unit, char *buf, size_t len)
{
    const char *space = *unit && strcmp(unit, "x") ? " " : "";
    if (!strcmp(op, "=="))
        snprintf(buf, len, "%.6g%s%s", v, space, unit);
    else
        snprintf(buf, len, "%s %.6g%s%s", op, v, space, unit);
}

void bench_target_describe(const bench_target *t, bench_target_status s, double value, const char *unit, char *buf,
                           size_t len)
{
    char target[64] = "", scaled[128] = "";
    if (t->found)
        target_text(t->op, t->value, unit, target, sizeof target);
    if (t->found && t->full) {
        char stated[48], full[32], size[32];
        target_text("==", t->stated, unit, stated, sizeof stated);
        snprintf(scaled, sizeof scaled, " (%s at %s, scaled to %s)", stated,
                 bench_size_name(t->full, full, sizeof full), bench_size_name(t->size, size, sizeof size));
    }
    const char *why = isnan(value) ? "no reading" : "a reading below zero cannot be";
    switch (s) {
    case BENCH_TARGET_NONE: snprintf(buf, len, "%s", ""); break;
    case BENCH_TARGET_MET: snprintf(buf, len, "target %s%s: met", target, scaled); break;
    case BENCH_TARGET_MISSED: snprintf(buf, len, "target %s%s: not met", target, scaled); break;
    case BENCH_TARGET_NA: snprintf(buf, len, "target %s%s: n/a (%s)", target, scaled, t->na_why); break;
    case BENCH_TARGET_NOISE:
        if (t->found)
            snprintf(buf, len, "noise: %s (target %s%s not checked; rerun, or give more --runs)", why, target,
                     scaled);
        else
            snprintf(buf, len, "noise: %s", why);
        break;
    }
}

static char targets_json[8192], missed_json[4096];
static size_t targets_len, missed_len;
static int counts[5];    /* of figures with a target, by status */
static int other_noise;  /* figures without a target read as noise */

void bench_targets_reset(void)
{
    targets_len = missed_len = 0;
    memset(counts, 0, sizeof counts);
    other_noise = 0;
}

void bench_targets_record(const char *json_key, double value, const bench_target *t, bench_target_status s)
{
    if (!t->found) {
        other_noise += s == BENCH_TARGET_NOISE; /* in the text only */
        return;
    }
    counts[s]++;
    static const char *const names[] = {"none", "met", "missed", "noise", "n/a"};
    char target[64], v[32];
    snprintf(target, sizeof target, "%s %.6g", t->op, t->value);
    if (isfinite(value))
        snprintf(v, sizeof v, "%.6g", value);
    else
        snprintf(v, sizeof v, "null");
    if (targets_len < sizeof targets_json - 384) {
        targets_len += (size_t)snprintf(targets_json + targets_len, sizeof targets_json - targets_len,
                                        "%s{\"figure\":%s,\"value\":%s,\"target\":\"%s\",\"status\":\"%s\"",
                                        targets_len ? "," : "", json_key, v, target, names[s]);
        if (t->full)
            targets_len += (size_t)snprintf(targets_json + targets_len, sizeof targets_json - targets_len,
                                            ",\"stated\":%.6g,\"full_bytes\":%zu,\"bytes\":%zu", t->stated, t->full,
                                            t->size);
        if (s == BENCH_TARGET_NA && targets_len < sizeof targets_json - 256) {
            char why[200];
            mapping_json_string(why, sizeof why, t->na_why);
            targets_len += (size_t)snprintf(targets_json + targets_len, sizeof targets_json - targets_len,
                                            ",\"why\":%s", why);
        }
        targets_len += (size_t)snprintf(targets_json + targets_len, sizeof targets_json - targets_len, "}");
    }
    if (s == BENCH_TARGET_MISSED && missed_len < sizeof missed_json - 256)
        missed_len += (size_t)snprintf(missed_json + missed_len, sizeof missed_json - missed_len,
                                       "%s{\"figure\":%s,\"value\":%s,\"target\":\"%s\"}", missed_len ? "," : "",
                                       json_key, v, target);
}

size_t bench_targets_json(char *buf, size_t len)
{
    int n = snprintf(buf, len, ",\"targets\":[%.*s],\"missed_targets\":[%.*s]", (int)targets_len, targets_json,
                     (int)missed_len, missed_json);
    return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
}

int bench_targets_failed(void)
{
    return counts[BENCH_TARGET_MISSED] + counts[BENCH_TARGET_NOISE];
}

void bench_targets_summary(FILE *out, int strict, int explain)
{
    int met = counts[BENCH_TARGET_MET], missed = counts[BENCH_TARGET_MISSED], noise = counts[BENCH_TARGET_NOISE];
    int na = counts[BENCH_TARGET_NA];
    if (!met && !missed && !noise && !na && !other_noise)
        return;
    fprintf(out, "\nTargets: %d met, %d not met", met, missed);
    if (na)
        fprintf(out, ", %d n/a (not for this device)", na);
    if (noise)
        fprintf(out, ", %d not checked (noise)", noise);
    if (other_noise)
        fprintf(out, "; %d other reading(s) noise", other_noise);
    if (strict)
        fprintf(out, " (--strict: %s)\n", missed || noise ? "the run fails" : "the run passes");
    else if (explain)
        fprintf(out, ". Targets are goals for a full run on a quiet machine, shown as information; "
                     "--strict makes a miss fail the run.\n");
    else
        fprintf(out, " (information: --strict makes a miss fail; --explain says more)\n");
}
