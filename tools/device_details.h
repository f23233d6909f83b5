/*
 * What `mapping info` shows beyond mapping_device_info, as clinfo and
 * nvidia-smi users expect: compute units, largest allocation, API version
 * (OpenCL version, CUDA compute capability), extensions, the PCIe link where
 * the driver reports it, and the link the library measures. Asked of the
 * driver through the device's native handles (the tool loads the driver
 * with dlopen, as the library does).
 */
#ifndef MAPPING_TOOLS_DEVICE_DETAILS_H
#define MAPPING_TOOLS_DEVICE_DETAILS_H

#include "mapping.h"

typedef struct device_details {
    int                compute_units;      /* -1: unknown */
    unsigned long long max_alloc_bytes;    /* 0: unknown */
    char               api_version[96];    /* "OpenCL 3.0 ...", "CUDA compute capability 8.0", "" */
    char               compute_capability[8]; /* CUDA: "8.0"; else "" */
    int                extensions_count;   /* OpenCL; -1: not applicable */
    char               extensions[192];    /* a summary: the notable ones */
    int                pcie_gen, pcie_width, pcie_max_gen, pcie_max_width; /* -1: not reported */
    mapping_link       link;               /* measured by the library; 0 when it could not be */
    char               note[128];          /* why something is missing, if it is */
} device_details;

/* Fills d for device `index` of back end `backend` (opens it for a moment). */
void device_details_get(const char *backend, int index, const mapping_device_info *info, device_details *d);

#endif
