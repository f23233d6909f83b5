/* Device details for `mapping info` (see device_details.h). */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include "device_details.h"

/* A path from the environment is loaded only when it is a regular file:
 * dlopen would wait for ever on a FIFO. */
static void *open_driver(const char *env, const char *a, const char *b)
{
    const char *path = getenv(env);
    if (path && *path) {
        struct stat sb;
        int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
        int regular = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
        if (fd >= 0)
            close(fd);
        return regular || !strchr(path, '/') ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    }
    void *lib = dlopen(a, RTLD_NOW | RTLD_LOCAL);
    return lib ? lib : dlopen(b, RTLD_NOW | RTLD_LOCAL);
}

static void *symbol(void *lib, const char *name)
{
    return lib ? dlsym(lib, name) : NULL;
}

/* ---- OpenCL: clGetDeviceInfo on the device's cl_device_id ---- */

enum {
    CL_MAX_COMPUTE_UNITS = 0x1002,
    CL_MAX_MEM_ALLOC_SIZE = 0x1010,
    CL_VERSION = 0x102F,
    CL_EXTENSIONS = 0x1030
};
typedef int (*cl_get_device_info_fn)(void *device, unsigned param, size_t size, void *value, size_t *size_ret);

static void summarise_extensions(const char *all, device_details *d)
{
    static const char *const notable[] = {"cl_khr_fp64",          "cl_khr_fp16",       "cl_khr_il_program",
                                          "cl_khr_subgroups",     "cl_khr_int64_base_atomics",
                                          "cl_intel_unified_shared_memory", "cl_khr_pci_bus_info",
                                          "cl_khr_device_uuid"};
    d->extensions_count = 0;
    for (const char *p = all; *p;) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        d->extensions_count++;
        while (*p && *p != ' ')
            p++;
    }
    size_t n = 0;
    for (size_t i = 0; i < sizeof notable / sizeof notable[0]; i++) {
        const char *hit = strstr(all, notable[i]);
        size_t len = strlen(notable[i]);
        if (hit && (hit[len] == ' ' || hit[len] == '\0') && n + len + 2 < sizeof d->extensions)
            n += (size_t)snprintf(d->extensions + n, sizeof d->extensions - n, "%s%s", n ? " " : "", notable[i]);
    }
}

static void opencl_details(void *device, device_details *d)
{
    void *lib = open_driver("MAPPING_OPENCL_LIBRARY", "libOpenCL.so.1", "libOpenCL.so");
    cl_get_device_info_fn info;
    void *sym = symbol(lib, "clGetDeviceInfo");
    if (!sym) {
        snprintf(d->note, sizeof d->note, "clGetDeviceInfo not found");
        return;
    }
    memcpy(&info, &sym, sizeof sym);
    unsigned units = 0;
    unsigned long long max_alloc = 0;
    char version[96] = "", *extensions = NULL;
    size_t ext_bytes = 0;
    if (info(device, CL_MAX_COMPUTE_UNITS, sizeof units, &units, NULL) == 0)
        d->compute_units = (int)units;
    if (info(device, CL_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL) == 0)
        d->max_alloc_bytes = max_alloc;
    if (info(device, CL_VERSION, sizeof version - 1, version, NULL) == 0)
        snprintf(d->api_version, sizeof d->api_version, "%s", version);
    if (info(device, CL_EXTENSIONS, 0, NULL, &ext_bytes) == 0 && (extensions = calloc(1, ext_bytes + 1)) &&
        info(device, CL_EXTENSIONS, ext_bytes, extensions, NULL) == 0)
        summarise_extensions(extensions, d);
    free(extensions);
    snprintf(d->note, sizeof d->note, "OpenCL does not report the PCIe link");
}

/* ---- CUDA: cuDeviceGetAttribute; the PCIe link from NVML where present ---- */

enum { CU_MULTIPROCESSORS = 16, CU_CC_MAJOR = 75, CU_CC_MINOR = 76 };
typedef int (*cu_attribute_fn)(int *value, int attribute, int device);
typedef int (*cu_total_mem_fn)(size_t *bytes, int device);
typedef int (*cu_bus_id_fn)(char *id, int len, int device);
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_by_bus_fn)(const char *bus, void **device);
typedef int (*nvml_uint_fn)(void *device, unsigned *value);

#define LOAD_(lib, type, name, var)              \
    type var = NULL;                             \
    {                                            \
        void *s_ = symbol(lib, name);            \
        memcpy(&var, &s_, sizeof s_);            \
    }

static void nvml_link(const char *bus_id, device_details *d)
{
    void *nvml = open_driver("MAPPING_NVML_LIBRARY", "libnvidia-ml.so.1", "libnvidia-ml.so");
    LOAD_(nvml, nvml_init_fn, "nvmlInit_v2", init)
    LOAD_(nvml, nvml_by_bus_fn, "nvmlDeviceGetHandleByPciBusId_v2", by_bus)
    LOAD_(nvml, nvml_uint_fn, "nvmlDeviceGetCurrPcieLinkGeneration", gen)
    LOAD_(nvml, nvml_uint_fn, "nvmlDeviceGetCurrPcieLinkWidth", width)
    LOAD_(nvml, nvml_uint_fn, "nvmlDeviceGetMaxPcieLinkGeneration", max_gen)
    LOAD_(nvml, nvml_uint_fn, "nvmlDeviceGetMaxPcieLinkWidth", max_width)
    void *dev = NULL;
    unsigned v;
    if (!init || !by_bus || !gen || !width || init() != 0 || by_bus(bus_id, &dev) != 0) {
        snprintf(d->note, sizeof d->note, "PCIe link: NVML (libnvidia-ml) is not available");
        return;
    }
    d->pcie_gen = gen(dev, &v) == 0 ? (int)v : -1;
    d->pcie_width = width(dev, &v) == 0 ? (int)v : -1;
    d->pcie_max_gen = max_gen && max_gen(dev, &v) == 0 ? (int)v : -1;
    d->pcie_max_width = max_width && max_width(dev, &v) == 0 ? (int)v : -1;
}

static void cuda_details(void *device, device_details *d)
{
    int dev = (int)(intptr_t)device;
    void *lib = open_driver("MAPPING_CUDA_LIBRARY", "libcuda.so.1", "libcuda.so");
    LOAD_(lib, cu_attribute_fn, "cuDeviceGetAttribute", attribute)
    LOAD_(lib, cu_total_mem_fn, "cuDeviceTotalMem_v2", total_mem)
    LOAD_(lib, cu_bus_id_fn, "cuDeviceGetPCIBusId", bus_id)
    int v, major = -1, minor = -1;
    size_t bytes = 0;
    if (attribute && attribute(&v, CU_MULTIPROCESSORS, dev) == 0)
        d->compute_units = v;
    if (attribute && attribute(&major, CU_CC_MAJOR, dev) == 0 && attribute(&minor, CU_CC_MINOR, dev) == 0) {
        snprintf(d->compute_capability, sizeof d->compute_capability, "%d.%d", major, minor);
        snprintf(d->api_version, sizeof d->api_version, "CUDA compute capability %d.%d", major, minor);
    }
    if (total_mem && total_mem(&bytes, dev) == 0)
        d->max_alloc_bytes = bytes;
    char bus[32];
    if (bus_id && bus_id(bus, sizeof bus, dev) == 0)
        nvml_link(bus, d);
    else
        snprintf(d->note, sizeof d->note, "PCIe link: the driver gives no PCI bus id");
}

void device_details_get(const char *backend, int index, const mapping_device_info *info, device_details *d)
{
    memset(d, 0, sizeof *d);
    d->compute_units = d->extensions_count = d->pcie_gen = d->pcie_width = d->pcie_max_gen = d->pcie_max_width = -1;
    mapping_device *dev;
    mapping_device_desc desc = {.backend = backend, .device = index};
    if (mapping_open(&desc, &dev) != MAPPING_OK) {
        snprintf(d->note, sizeof d->note, "cannot open: %s", mapping_last_error_message());
        return;
    }
    mapping_native_device native = {0};
    mapping_device_native(dev, &native);
    if (!strcmp(backend, "opencl") && native.device) {
        opencl_details(native.device, d);
    } else if (!strcmp(backend, "cuda")) {
        cuda_details(native.device, d);
    } else if (!strcmp(backend, "host")) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        d->compute_units = cpus > 0 ? (int)cpus : -1;
        d->max_alloc_bytes = info->memory_bytes;
        snprintf(d->api_version, sizeof d->api_version, "host back end (memcpy on the CPU)");
        snprintf(d->note, sizeof d->note, "no PCIe link: device memory is the CPU's");
    }
    if (mapping_device_link(dev, &d->link) != MAPPING_OK)
        d->link = (mapping_link){0, 0};
    mapping_close(dev);
}
