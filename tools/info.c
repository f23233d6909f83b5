/* mapping info: what the library can use on this machine, and why not. */
#include <stdio.h>
#include <string.h>
#include "mapping.h"

static const struct {
    unsigned    bit;
    const char *name;
} cap_names[] = {
    {MAPPING_CAP_PINNED_HOST, "pinned-host"},   {MAPPING_CAP_ASYNC_COPY, "async-copy"},
    {MAPPING_CAP_UNIFIED, "unified"},           {MAPPING_CAP_CONCURRENT_UNIFIED, "concurrent-unified"},
    {MAPPING_CAP_BATCH_COPY, "batch-copy"},     {MAPPING_CAP_HOST_REGISTER, "host-register"},
    {MAPPING_CAP_TIMING, "timing"},             {MAPPING_CAP_DEVICE_KERNELS, "device-kernels"},
    {MAPPING_CAP_LINK_MODEL, "link-model"},
    {MAPPING_CAP_CPU_MEMORY, "cpu-memory"},
};

static void print_caps(unsigned caps, int json)
{
    int first = 1;
    for (size_t i = 0; i < sizeof cap_names / sizeof cap_names[0]; i++)
        if (caps & cap_names[i].bit) {
            printf(json ? "%s\"%s\"" : "%s%s", first ? "" : json ? "," : " ", cap_names[i].name);
            first = 0;
        }
}

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s >= 0x20)
            putchar(*s);
    putchar('"');
}

int info_main(int argc, char **argv)
{
    int json = argc > 0 && !strcmp(argv[0], "--json");
    mapping_backend_info backends[8];
    int nb = 0;
    if (mapping_list_backends(backends, 8, &nb) != MAPPING_OK) {
        fprintf(stderr, "mapping info: %s\n", mapping_last_error_message());
        return 1;
    }
    if (json)
        printf("{\"version\":\"%s\",\"backends\":[", mapping_version());
    else
        printf("mapping %s\n\nback ends:\n", mapping_version());
    for (int b = 0; b < nb && b < 8; b++) {
        mapping_backend_info *bi = &backends[b];
        if (json) {
            printf("%s{\"name\":\"%s\",\"compiled\":%s,\"available\":%s,\"reason\":", b ? "," : "", bi->name,
                   bi->compiled ? "true" : "false", bi->available ? "true" : "false");
            json_str(bi->reason);
            printf(",\"devices\":[");
        } else {
            printf("  %-7s %s%s%s\n", bi->name,
                   !bi->compiled ? "not compiled in" : bi->available ? "available" : "unavailable",
                   bi->reason[0] ? ": " : "", bi->reason);
        }
        mapping_device_info devs[16];
        int nd = 0;
        if (bi->available)
            mapping_list_devices(bi->name, devs, 16, &nd);
        for (int d = 0; d < nd && d < 16; d++) {
            mapping_device_info *di = &devs[d];
            if (json) {
                printf("%s{\"index\":%d,\"kind\":\"%s\",\"name\":", d ? "," : "", di->index, di->kind);
                json_str(di->name);
                printf(",\"vendor\":");
                json_str(di->vendor);
                printf(",\"driver\":");
                json_str(di->driver);
                printf(",\"memory_bytes\":%llu,\"caps\":[", (unsigned long long)di->memory_bytes);
                print_caps(di->caps, 1);
                printf("]}");
            } else {
                printf("    [%d] %s (%s, %s)\n        driver: %s\n        memory: %.2f GiB\n        caps:   ", di->index,
                       di->name, di->kind, di->vendor, di->driver, (double)di->memory_bytes / (1u << 30));
                print_caps(di->caps, 0);
                printf("\n");
            }
        }
        if (json)
            printf("]}");
    }
    mapping_device *dev;
    if (mapping_open(NULL, &dev) == MAPPING_OK) {
        printf(json ? "],\"default\":\"%s\"}\n" : "\ndefault back end: %s (MAPPING_BACKEND overrides)\n",
               mapping_backend_name(dev));
        mapping_close(dev);
    } else {
        printf(json ? "],\"default\":null}\n" : "\nno default device: %s\n", mapping_last_error_message());
    }
    return 0;
}
