/* mapping: the command-line tool. `mapping info`, `mapping bench`. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "mapping.h"

int info_main(int argc, char **argv);
int bench_main(int argc, char **argv);

static void usage(FILE *f)
{
    fprintf(f, "mapping %s: move data between CPU and accelerator memory\n\n"
               "usage:\n"
               "  mapping info [--json]       back ends, devices, memory and capabilities\n"
               "  mapping bench [options]     transfer benchmarks (mapping bench --help)\n"
               "  mapping --version\n\n"
               "environment: MAPPING_BACKEND (host, opencl, cuda), MAPPING_DEVICE (index),\n"
               "  MAPPING_HOST_LINK (bandwidth,latency for the host back end's link model),\n"
               "  MAPPING_TRACE (a file: Chrome Trace Event JSON of what the library did),\n"
               "  MAPPING_TRACE_MAX_EVENTS (the most events it keeps, the newest; default 1000000),\n"
               "  MAPPING_CHECK=unmarked (mirror syncs catch host writes without a mark)\n"
               "exit status: 0 done, 1 failed, 2 bad command line or MAPPING_* setting, 3 bench --strict:\n"
               "  a target missed, 77 back end not available\n"
               "see mapping(1)\n",
            mapping_version());
}

/* A closed standard stream (`mapping info >&-`) is held by /dev/null,
 * opened read-only: writes to it then fail (and are reported), and no file
 * the library opens takes its number and receives the report. */
static void hold_closed_standard_streams(void)
{
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
            int held = open("/dev/null", O_RDONLY);
            if (held >= 0 && held != fd) {
                dup2(held, fd);
                close(held);
            }
        }
}

/* The exit status once the report is out: 1 when it could not all be
 * written (a closed stdout, a full disk: /dev/full), said on stderr. */
static int report_written(int status)
{
    errno = 0;
    bool failed = fflush(stdout) != 0 || ferror(stdout);
    int err = errno;
    if (!failed)
        return status;
    fprintf(stderr, "mapping: the report could not be written to standard output: %s\n",
            err ? strerror(err) : "a write failed");
    return status == 0 || status == 3 ? 1 : status;
}

static int run(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "info"))
        return info_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench"))
        return bench_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("%s\n", mapping_version());
        return 0;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "mapping: unknown command %s\n\n", argv[1]);
    usage(stderr);
    return 2;
}

/* The stop's warning, on stderr: a trace that dropped events (it keeps at
 * most MAPPING_TRACE_MAX_EVENTS) says how many. Installed only around the
 * stop: a log callback makes the library format its info lines, which
 * would cost the benchmarks time. */
static void trace_warning(int level, const char *message, void *user)
{
    (void)user;
    if (level == 1 && !strncmp(message, "trace ", 6))
        fprintf(stderr, "mapping: warning: %s\n", message);
}

/* A trace recorded through MAPPING_TRACE is written now, not by the
 * library's exit handler, so that a trace that cannot be written fails the
 * command (exit 1) instead of being reported after the status was chosen. */
static int trace_written(int status)
{
    if (!mapping_trace_active())
        return status;
    mapping_set_log(trace_warning, NULL);
    mapping_status st = mapping_trace_stop();
    mapping_set_log(NULL, NULL);
    if (st == MAPPING_OK)
        return status;
    fprintf(stderr, "mapping: %s\n", mapping_last_error_message());
    return status == 0 || status == 3 ? 1 : status;
}

int main(int argc, char **argv)
{
    hold_closed_standard_streams();
    /* The report first, then the trace: a trace written onto the report's
     * own stream (MAPPING_TRACE=/dev/stdout) follows it, instead of being
     * overwritten by it or cutting into it. */
    return trace_written(report_written(run(argc, argv)));
}
