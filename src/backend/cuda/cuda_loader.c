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
    {35, "CUDA_ERROR_INSUFFICIENT_DRIVER"},
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

const char *cuda_error_name(cu_result code)
{
    const char *name = NULL;
    if (loaded && loaded->cuGetErrorName && loaded->cuGetErrorName(code, &name) == CU_SUCCESS && name)
        return name;
    for (size_t i = 0; i < sizeof error_names / sizeof error_names[0]; i++)
        if (error_names[i].code == code)
            return error_names[i].name;
    return "unknown CUresult";
}

/* One entry of the table: the symbol to look up, where to store it, and
 * whether the back end can live without it. */
typedef struct symbol {
    const char *name;
    void      **slot;
    bool        required;
} symbol;

#define REQ(field) {#field, (void **)&driver.field, true}
#define OPT(field) {#field, (void **)&driver.field, false}

static bool resolve(char *why, size_t why_size)
{
    const symbol symbols[] = {
        REQ(cuInit), REQ(cuDriverGetVersion), REQ(cuDeviceGetCount), REQ(cuDeviceGet), REQ(cuDeviceGetName),
        REQ(cuDeviceTotalMem_v2), REQ(cuDeviceGetAttribute), REQ(cuDevicePrimaryCtxRetain),
        REQ(cuDevicePrimaryCtxRelease_v2), REQ(cuCtxGetCurrent), REQ(cuCtxPushCurrent_v2), REQ(cuCtxPopCurrent_v2),
        REQ(cuMemAlloc_v2), REQ(cuMemFree_v2), REQ(cuMemHostAlloc), REQ(cuMemFreeHost), REQ(cuMemHostRegister_v2),
        REQ(cuMemHostUnregister), REQ(cuMemcpyHtoD_v2), REQ(cuMemcpyDtoH_v2), REQ(cuMemcpyDtoD_v2),
        REQ(cuMemcpyHtoDAsync_v2), REQ(cuMemcpyDtoHAsync_v2), REQ(cuMemcpyDtoDAsync_v2), REQ(cuMemsetD8_v2),
        REQ(cuMemsetD8Async), REQ(cuStreamCreate), REQ(cuStreamDestroy_v2), REQ(cuStreamSynchronize),
        REQ(cuLaunchHostFunc), REQ(cuEventCreate), REQ(cuEventDestroy_v2), REQ(cuEventRecord), REQ(cuEventQuery),
        REQ(cuEventSynchronize), REQ(cuStreamWaitEvent),
        OPT(cuGetErrorName), OPT(cuMemAllocManaged), OPT(cuMemPrefetchAsync_v2), OPT(cuMemPrefetchAsync),
        OPT(cuMemcpyBatchAsync_v2), OPT(cuMemcpyBatchAsync), OPT(cuModuleLoadData), OPT(cuModuleUnload),
        OPT(cuModuleGetFunction), OPT(cuLaunchKernel),
    };
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        *symbols[i].slot = mapping_os_dlsym(driver.lib, symbols[i].name);
        if (!*symbols[i].slot && symbols[i].required) {
            snprintf(why, why_size, "the CUDA driver is too old: libcuda lacks %s (a driver for CUDA 10.0 or later is needed)",
                     symbols[i].name);
            return false;
        }
    }
    /* Same signature; _v2 (CUDA 12.8) fixes corner cases of the original. */
    void *elapsed = mapping_os_dlsym(driver.lib, "cuEventElapsedTime_v2");
    if (!elapsed)
        elapsed = mapping_os_dlsym(driver.lib, "cuEventElapsedTime");
    if (!elapsed) {
        snprintf(why, why_size, "the CUDA driver is too old: libcuda lacks cuEventElapsedTime");
        return false;
    }
    *(void **)&driver.cuEventElapsedTime = elapsed;
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
        /* cuda_error_name() must not ask this driver yet: it is not usable. */
        const char *name = cuda_error_name(r);
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

const cuda_driver *cuda_driver_load(char *why, size_t why_size)
{
    pthread_once(&load_once, load);
    if (!loaded && why)
        snprintf(why, why_size, "%s", load_why);
    return loaded;
}

const cuda_driver *cuda_driver_get(void)
{
    return loaded;
}

bool cuda_driver_has_batch_copy(const cuda_driver *cu)
{
    return cu->cuMemcpyBatchAsync_v2 || cu->cuMemcpyBatchAsync;
}

bool cuda_driver_has_kernels(const cuda_driver *cu)
{
    return cu->cuModuleLoadData && cu->cuModuleUnload && cu->cuModuleGetFunction && cu->cuLaunchKernel;
}
