/*
 * Loading the CUDA driver at run time: dlopen libcuda ($MAPPING_CUDA_LIBRARY,
 * then libcuda.so.1, then libcuda.so), resolve every entry point into the
 * typed table of cuda_driver.h, check each one, and cuInit. Anything missing
 * or failing leaves a one-line reason for `mapping info`; nothing aborts.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_driver.h"
#include "os/os.h"

static cuda_driver driver;
static const cuda_driver *loaded;
static char load_why[256];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

/* Names of common CUresults, for drivers whose cuGetErrorName is missing or
 * refuses (the toolkit's stub library answers CUDA_ERROR_STUB_LIBRARY). */
static const struct {
    cu_result   code;
    const char *name;
} error_names[] = {
    {0, "CUDA_SUCCESS"},
    {1, "CUDA_ERROR_INVALID_VALUE"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"},
    {4, "CUDA_ERROR_DEINITIALIZED"},
    {34, "CUDA_ERROR_STUB_LIBRARY"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
    {100, "CUDA_ERROR_NO_DEVICE"},
    {101, "CUDA_ERROR_INVALID_DEVICE"},
    {200, "CUDA_ERROR_INVALID_IMAGE"},
    {201, "CUDA_ERROR_INVALID_CONTEXT"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
    {218, "CUDA_ERROR_INVALID_PTX"},
    {221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM"},
    {400, "CUDA_ERROR_INVALID_HANDLE"},
    {401, "CUDA_ERROR_ILLEGAL_STATE"},
    {500, "CUDA_ERROR_NOT_FOUND"},
    {600, "CUDA_ERROR_NOT_READY"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"},
    {719, "CUDA_ERROR_LAUNCH_FAILED"},
    {800, "CUDA_ERROR_NOT_PERMITTED"},
    {801, "CUDA_ERROR_NOT_SUPPORTED"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
    {999, "CUDA_ERROR_UNKNOWN"},
};

const char *mapping__cuda_error_name(cu_result code)
{
    const char *name = NULL;
    if (loaded && loaded->cuGetErrorName && loaded->cuGetErrorName(code, &name) == CU_SUCCESS && name)
        return name;
    for (size_t i = 0; i < sizeof error_names / sizeof error_names[0]; i++)
        if (error_names[i].code == code)
            return error_names[i].name;
    return "unknown CUresult";
}

/* One entry of the table: the symbol to look up, where to store it, whether
 * the back end can live without it, and whether name_v2 comes first. */
typedef struct cuda_symbol {
    const char *name;
    void      **slot;
    bool        required;
    bool        prefer_v2;
} cuda_symbol;

static const cuda_symbol symbols[] = {
#define REQUIRED_(name, params) {#name, (void **)&driver.name, true, false},
#define PREFER_V2_(name, params) {#name, (void **)&driver.name, true, true},
#define OPTIONAL_(name, params) {#name, (void **)&driver.name, false, false},
    CUDA_REQUIRED_ENTRY_POINTS(REQUIRED_)
    CUDA_REQUIRED_PREFER_V2_ENTRY_POINTS(PREFER_V2_)
    CUDA_OPTIONAL_ENTRY_POINTS(OPTIONAL_)
#undef REQUIRED_
#undef PREFER_V2_
#undef OPTIONAL_
};

static bool resolve(char *why, size_t why_size)
{
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        const cuda_symbol *sym = &symbols[i];
        *sym->slot = NULL;
        if (sym->prefer_v2) {
            char v2[64];
            snprintf(v2, sizeof v2, "%s_v2", sym->name);
            *sym->slot = mapping_os_dlsym(driver.lib, v2);
        }
        if (!*sym->slot)
            *sym->slot = mapping_os_dlsym(driver.lib, sym->name);
        if (!*sym->slot && sym->required) {
            snprintf(why, why_size,
                     "the CUDA driver is too old: libcuda lacks %s (a driver for CUDA 11.0 or later, R450+, is needed)",
                     sym->name);
            return false;
        }
    }
    return true;
}

static void load(void)
{
    static const char *const names[] = {"libcuda.so.1", "libcuda.so", NULL};
    char why[200] = "";
    driver.lib = mapping_os_dlopen_first("MAPPING_CUDA_LIBRARY", names, why, sizeof why);
    if (!driver.lib) {
        const char *env = getenv("MAPPING_CUDA_LIBRARY");
        if (env && *env)
            snprintf(load_why, sizeof load_why, "no CUDA driver: %.200s", why);
        else /* dlerror() names only the last try */
            snprintf(load_why, sizeof load_why, "no CUDA driver: neither libcuda.so.1 nor libcuda.so loads (%.160s)", why);
        return;
    }
    if (!resolve(load_why, sizeof load_why))
        return;
    cu_result r = driver.cuInit(0);
    if (r != CU_SUCCESS) {
        /* mapping__cuda_error_name() must not ask this driver yet: it is not usable. */
        const char *name = mapping__cuda_error_name(r);
        const char *hint = r == CU_ERROR_STUB_LIBRARY ? " (the toolkit's stub libcuda, not a driver)"
                           : r == CU_ERROR_NO_DEVICE  ? " (no NVIDIA GPU visible)"
                                                      : "";
        snprintf(load_why, sizeof load_why, "cuInit failed: %s (%d)%s", name, r, hint);
        return;
    }
    if (driver.cuDriverGetVersion(&driver.version) != CU_SUCCESS)
        driver.version = 0;
    loaded = &driver;
}

const cuda_driver *mapping__cuda_driver_load(char *why, size_t why_size)
{
    pthread_once(&load_once, load);
    if (!loaded && why)
        snprintf(why, why_size, "%s", load_why);
    return loaded;
}

const cuda_driver *mapping__cuda_driver_get(void)
{
    return loaded;
}

bool mapping__cuda_driver_has_batch_copy(const cuda_driver *cu)
{
    return cu->cuMemcpyBatchAsync_v2 || cu->cuMemcpyBatchAsync;
}

bool mapping__cuda_driver_has_kernels(const cuda_driver *cu)
{
    return cu->cuModuleLoadData && cu->cuModuleUnload && cu->cuModuleGetFunction && cu->cuLaunchKernel;
}
