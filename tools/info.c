/* mapping info: what the library can use on this machine, and why not. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mapping.h"
#include "os/json.h"
#include "device_details.h"

enum { MAX_BACKENDS = 8 };

/* The labels of the bits set in caps, in MAPPING_CAP_LIST order: space
 * separated, or as the elements of a JSON array. */
static void print_caps(unsigned caps, int json)
{
    int first = 1;
#define PRINT_CAP_(name, bit, label)                                                              \
    if (caps & MAPPING_CAP_##name) {                                                              \
        printf(json ? "%s\"%s\"" : "%s%s", first ? "" : json ? "," : " ", label);                 \
        first = 0;                                                                                \
    }
    MAPPING_CAP_LIST(PRINT_CAP_)
#undef PRINT_CAP_
}

static void json_int_or_null(const char *key, long long v)
{
    if (v < 0)
        printf(",\"%s\":null", key);
    else
        printf(",\"%s\":%lld", key, v);
}

static void print_details_json(const device_details *d)
{
    json_int_or_null("compute_units", d->compute_units);
    printf(",\"max_alloc_bytes\":%llu,\"api_version\":", d->max_alloc_bytes);
    mapping_json_fputs(d->api_version, stdout);
    printf(",\"compute_capability\":");
    if (d->compute_capability[0])
        mapping_json_fputs(d->compute_capability, stdout);
    else
        printf("null");
    json_int_or_null("extensions_count", d->extensions_count);
    printf(",\"extensions\":");
    mapping_json_fputs(d->extensions, stdout);
    json_int_or_null("pcie_generation", d->pcie_gen);
    json_int_or_null("pcie_width", d->pcie_width);
    json_int_or_null("pcie_max_generation", d->pcie_max_gen);
    json_int_or_null("pcie_max_width", d->pcie_max_width);
    printf(",\"link_latency_s\":%.6g,\"link_bandwidth_bytes_per_s\":%.6g,\"note\":", d->link.latency,
           d->link.bandwidth);
    mapping_json_fputs(d->note, stdout);
}

static void print_details_text(const device_details *d)
{
    printf("        compute units: ");
    if (d->compute_units >= 0)
        printf("%d", d->compute_units);
    else
        printf("n/a");
    printf(", max allocation: ");
    if (d->max_alloc_bytes)
        printf("%.2f GiB\n", (double)d->max_alloc_bytes / (1u << 30));
    else
        printf("n/a\n");
    if (d->api_version[0])
        printf("        api:    %s\n", d->api_version);
    if (d->extensions_count >= 0)
        printf("        extensions: %d%s%s%s\n", d->extensions_count, d->extensions[0] ? " (" : "", d->extensions,
               d->extensions[0] ? ")" : "");
    if (d->pcie_gen >= 0 || d->pcie_width >= 0)
        printf("        PCIe:   gen %d x%d (max gen %d x%d)\n", d->pcie_gen, d->pcie_width, d->pcie_max_gen,
               d->pcie_max_width);
    if (d->link.bandwidth > 0)
        printf("        link:   %.2f us per transfer, %.2f GB/s host to device (measured)\n", d->link.latency * 1e6,
               d->link.bandwidth * 1e-9);
    if (d->note[0])
        printf("        note:   %s\n", d->note);
}

static void print_device(const mapping_device_info *di, int first, int json)
{
    device_details details;
    device_details_get(di->backend, di->index, di, &details);
    if (json) {
        printf("%s{\"index\":%d,\"kind\":", first ? "" : ",", di->index);
        mapping_json_fputs(di->kind, stdout);
        printf(",\"name\":");
        mapping_json_fputs(di->name, stdout);
        printf(",\"vendor\":");
        mapping_json_fputs(di->vendor, stdout);
        printf(",\"driver\":");
        mapping_json_fputs(di->driver, stdout);
        printf(",\"memory_bytes\":%llu,\"caps\":[", (unsigned long long)di->memory_bytes);
        print_caps(di->caps, 1);
        printf("]");
        print_details_json(&details);
        printf("}");
    } else {
        printf("    [%d] %s (%s, %s)\n        driver: %s\n        memory: %.2f GiB\n        caps:   ", di->index,
               di->name, di->kind, di->vendor, di->driver, (double)di->memory_bytes / (1u << 30));
        print_caps(di->caps, 0);
        printf("\n");
        print_details_text(&details);
    }
}

/* One back end and, when it is available, its devices. */
static void print_backend(const mapping_backend_info *bi, int first, int json)
{
    if (json) {
        printf("%s{\"name\":", first ? "" : ",");
        mapping_json_fputs(bi->name, stdout);
        printf(",\"compiled\":%s,\"available\":%s,\"reason\":", bi->compiled ? "true" : "false",
               bi->available ? "true" : "false");
        mapping_json_fputs(bi->reason, stdout);
        printf(",\"devices\":[");
    } else {
        printf("  %-7s %s%s%s\n", bi->name,
               !bi->compiled ? "not compiled in" : bi->available ? "available" : "unavailable",
               bi->reason[0] ? ": " : "", bi->reason);
    }
    /* Every device, however many (MAPPING_HOST_DEVICES=64 makes 64). */
    mapping_device_info *devs = NULL;
    int nd = 0;
    if (bi->available && mapping_list_devices(bi->name, NULL, 0, &nd) == MAPPING_OK && nd > 0 &&
        (!(devs = calloc((size_t)nd, sizeof *devs)) || mapping_list_devices(bi->name, devs, nd, &nd) != MAPPING_OK))
        nd = 0;
    for (int d = 0; d < nd; d++)
        print_device(&devs[d], d == 0, json);
    free(devs);
    if (json)
        printf("]}");
}

/* Whether the default open failed for a bad setting rather than for what
 * this machine lacks: a value the library refuses (MAPPING_HOST_LINK=nan, a
 * MAPPING_TRACE file that cannot be made), MAPPING_DEVICE past the back
 * end's devices, a MAPPING_BACKEND that names no back end, or the built-in
 * host back end made unavailable by MAPPING_HOST_DEVICES (it has no driver
 * to miss). */
static int bad_setting(mapping_status st, const mapping_backend_info *backends, int nb)
{
    if (st == MAPPING_ERR_INVALID_ARGUMENT || st == MAPPING_ERR_NO_DEVICE)
        return 1;
    if (st != MAPPING_ERR_NO_BACKEND)
        return 0;
    const char *env = getenv("MAPPING_BACKEND");
    int named = env && *env, known = 0;
    const mapping_backend_info *host = NULL;
    for (int b = 0; b < nb && b < MAX_BACKENDS; b++) {
        known |= named && !strcmp(backends[b].name, env);
        if (!strcmp(backends[b].name, "host"))
            host = &backends[b];
    }
    if (named && !known)
        return 1; /* a misspelt MAPPING_BACKEND */
    if (named && strcmp(env, "host"))
        return 0; /* a back end this machine lacks: information */
    return host && host->compiled && !host->available;
}

/* The back end mapping_open(NULL) picks, which closes the report: the
 * exit status, 2 when a bad setting keeps it from opening (said on stderr
 * too; the report is whole). */
static int print_default(int json, const mapping_backend_info *backends, int nb)
{
    mapping_device *dev;
    mapping_status st = mapping_open(NULL, &dev);
    if (st == MAPPING_OK) {
        printf(json ? "],\"default\":\"%s\"" : "\ndefault back end: %s (MAPPING_BACKEND overrides)\n",
               mapping_backend_name(dev));
        uint64_t budget = 0; /* of the default device: $MAPPING_MEMORY_BUDGET, else none */
        mapping_device_memory_budget(dev, &budget, NULL);
        if (json) { /* write tracking is the process's, not a device's (MAPPING_TRACK overrides) */
            printf(",\"write_tracking\":");
            mapping_json_fputs(mapping_write_tracking_description(), stdout);
            printf(",\"memory_budget\":%llu}\n", (unsigned long long)budget);
        } else {
            printf("write tracking: %s (MAPPING_TRACK overrides)\n", mapping_write_tracking_description());
            if (budget)
                printf("memory budget: %llu bytes (%.2f GiB) per device opened without one (MAPPING_MEMORY_BUDGET)\n",
                       (unsigned long long)budget, (double)budget / (1u << 30));
            else
                printf("memory budget: none (MAPPING_MEMORY_BUDGET or mapping_device_desc.memory_budget sets one)\n");
        }
        mapping_close(dev);
        return 0;
    }
    printf(json ? "],\"default\":null}\n" : "\nno default device: %s\n", mapping_last_error_message());
    if (!bad_setting(st, backends, nb))
        return 0;
    fprintf(stderr, "mapping info: %s\n", mapping_last_error_message());
    return 2;
}

/* argv[0] is "info". Returns KEEP_GOING, or the exit status. */
enum { KEEP_GOING = -1 };
static int parse_info_args(int argc, char **argv, int *json)
{
    static const struct option options[] = {{"json", no_argument, NULL, 'j'},
                                            {"version", no_argument, NULL, 'v'},
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
    opterr = 0;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "+h", options, NULL)) != -1;) {
        switch (c) {
        case 'j': *json = 1; break;
        case 'v': printf("mapping %s\n", mapping_version()); return 0;
        case 'h': printf("usage: mapping info [--json]\n"); return 0;
        default:
            fprintf(stderr, "mapping info: %s is unknown\nusage: mapping info [--json]\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "mapping info: unexpected argument '%s'\nusage: mapping info [--json]\n", argv[optind]);
        return 2;
    }
    return KEEP_GOING;
}

int info_main(int argc, char **argv)
{
    int json = 0, status = parse_info_args(argc, argv, &json);
    if (status != KEEP_GOING)
        return status;
    mapping_backend_info backends[MAX_BACKENDS];
    int nb = 0;
    if (mapping_list_backends(backends, MAX_BACKENDS, &nb) != MAPPING_OK) {
        fprintf(stderr, "mapping info: %s\n", mapping_last_error_message());
        return 1;
    }
    if (json)
        printf("{\"version\":\"%s\",\"backends\":[", mapping_version());
    else
        printf("mapping %s\n\nback ends:\n", mapping_version());
    for (int b = 0; b < nb && b < MAX_BACKENDS; b++)
        print_backend(&backends[b], b == 0, json);
    return print_default(json, backends, nb);
}
