/*
 * The registry of `mapping bench` sections: each section's file registers
 * itself (BENCH_SECTION, bench.h) before main runs; bench_main sorts them
 * by their order key and runs those --only names.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bench.h"

static const bench_section *sections[64];
static int section_count;

void bench_register(const bench_section *section)
{
    if (section_count < (int)(sizeof sections / sizeof sections[0]))
        sections[section_count++] = section;
}

int bench_section_count(void)
{
    return section_count;
}

const bench_section *bench_section_at(int i)
{
    return sections[i];
}

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

void bench_sort_sections(void)
{
    qsort(sections, (size_t)section_count, sizeof sections[0], compare_sections);
}

int bench_run_sections(bench_ctx *ctx, const char *only)
{
    int failed = 0;
    for (int i = 0; i < section_count; i++) {
        if (!wanted(only, sections[i]->name))
            continue;
        ctx->section = sections[i]->name;
        ctx->progress_last = bench_now(); /* the first progress line after half a second */
        double t0 = bench_now();
        int rc = sections[i]->run(ctx);
        if (bench_now() - t0 > 1.0)
            fprintf(stderr, isatty(STDERR_FILENO) ? "\r\033[Kmapping bench: %s: done in %.1f s\n"
                                                  : "mapping bench: %s: done in %.1f s\n",
                    sections[i]->name, bench_now() - t0);
        if (rc != 0) {
            fprintf(stderr, "mapping bench: section %s failed\n", sections[i]->name);
            failed = 1;
        }
    }
    return failed;
}
