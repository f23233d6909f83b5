/* The command line of `mapping bench` (bench_args.c). */
#ifndef MAPPING_BENCH_ARGS_H
#define MAPPING_BENCH_ARGS_H

#include "bench.h"

/* What the command line asks for, besides what bench_ctx holds. */
typedef struct bench_args {
    const char *backend, *only;
    int         device; /* -1: not given */
} bench_args;

/* parse_args, open_device: carry on (any other value is the exit status). */
enum { KEEP_GOING = -1 };

/* Reads argv (argv[0] is "bench") into args and ctx; returns KEEP_GOING, or
 * the exit status when the command ends here (--help, --version, a bad
 * argument: 2). */
int bench_parse_args(int argc, char **argv, bench_args *args, bench_ctx *ctx);

#endif
