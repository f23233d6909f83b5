/* mapping: the command-line tool. `mapping info`, `mapping bench`. */
#include <stdio.h>
#include <string.h>
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
               "  MAPPING_CHECK=unmarked (mirror syncs catch host writes without a mark)\n"
               "exit status: 0 done, 1 failed, 2 bad command line, 3 bench --strict: a target missed,\n"
               "  77 back end not available\n"
               "see mapping(1)\n",
            mapping_version());
}

int main(int argc, char **argv)
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
