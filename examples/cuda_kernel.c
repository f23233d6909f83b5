/*
 * The seed's scenario on CUDA with a real kernel: allocate on the GPU, sync
 * the CPU data to it, run saxpy (y = a*x + y) on the library's stream, sync
 * the result back to page-locked CPU memory, print it.
 *
 * The kernel ships as PTX (examples/kernels/scale.cu -> scale_ptx.h), so this
 * builds without the CUDA toolkit; the driver calls the example makes itself
 * (load the module, launch) go through libcuda opened with dlopen, the same
 * library the mapping back end uses. Exits 77 (SKIP) when CUDA is absent.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "kernels/scale_ptx.h"
#include "check.h"
#include "mapping.h"

/* The few driver types and calls the example needs (cuda.h, CUDA 10+). */
typedef int CUresult;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
static CUresult (*cuCtxPushCurrent_v2)(CUcontext);
static CUresult (*cuCtxPopCurrent_v2)(CUcontext *);
static CUresult (*cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuModuleUnload)(CUmodule);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void **, void **);

#define CHECK_CU(call)                                           \
    do {                                                         \
        CUresult r_ = (call);                                    \
        if (r_ != 0) {                                           \
            fprintf(stderr, "%s failed: CUresult %d\n", #call, r_); \
            return 1;                                            \
        }                                                        \
    } while (0)

static int load_driver(void)
{
    const char *path = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 0;
    *(void **)&cuCtxPushCurrent_v2 = dlsym(lib, "cuCtxPushCurrent_v2");
    *(void **)&cuCtxPopCurrent_v2 = dlsym(lib, "cuCtxPopCurrent_v2");
    *(void **)&cuModuleLoadData = dlsym(lib, "cuModuleLoadData");
    *(void **)&cuModuleGetFunction = dlsym(lib, "cuModuleGetFunction");
    *(void **)&cuModuleUnload = dlsym(lib, "cuModuleUnload");
    *(void **)&cuLaunchKernel = dlsym(lib, "cuLaunchKernel");
    return cuCtxPushCurrent_v2 && cuCtxPopCurrent_v2 && cuModuleLoadData && cuModuleGetFunction && cuModuleUnload &&
           cuLaunchKernel;
}

int main(void)
{
    mapping_device *dev;
    mapping_status st = mapping_open(&(mapping_device_desc){.backend = "cuda"}, &dev);
    if (st == MAPPING_ERR_NO_BACKEND || st == MAPPING_ERR_NO_DEVICE) {
        printf("SKIP: cuda is not available here: %s\n", mapping_last_error_message());
        return 77;
    }
    CHECK(st);
    if (!load_driver()) {
        printf("SKIP: libcuda lacks the module and launch entry points\n");
        mapping_close(dev);
        return 77;
    }
    mapping_device_info info;
    CHECK(mapping_device_get_info(dev, &info));
    printf("back end: %s, %s (%s)\n", mapping_backend_name(dev), info.name, info.driver);

    enum { N = 3 };
    float cpu_x[N] = {1.0f, 2.0f, 3.0f}, cpu_y[N] = {10.0f, 20.0f, 30.0f};
    const float a = 2.0f;
    mapping_buffer *gpu_x, *gpu_y;
    CHECK(mapping_allocate_gpu(dev, sizeof cpu_x, &gpu_x));
    CHECK(mapping_allocate_gpu(dev, sizeof cpu_y, &gpu_y));
    CHECK(mapping_sync_to_gpu(cpu_x, gpu_x)); /* CPU -> GPU */
    CHECK(mapping_sync_to_gpu(cpu_y, gpu_y));

    /* The native handles: the context, the buffers' CUdeviceptrs, the stream. */
    mapping_native_device native;
    void *x_ptr, *y_ptr, *stream_handle;
    mapping_stream *stream;
    CHECK(mapping_device_native(dev, &native));
    CHECK(mapping_buffer_native(gpu_x, &x_ptr));
    CHECK(mapping_buffer_native(gpu_y, &y_ptr));
    CHECK(mapping_stream_create(dev, &stream));
    CHECK(mapping_stream_native(stream, &stream_handle));

    CHECK_CU(cuCtxPushCurrent_v2(native.context));
    CUmodule module;
    CUfunction saxpy;
    CHECK_CU(cuModuleLoadData(&module, scale_ptx)); /* JIT-compiled for this GPU */
    CHECK_CU(cuModuleGetFunction(&saxpy, module, "saxpy"));
    unsigned long long x = (uintptr_t)x_ptr, y = (uintptr_t)y_ptr; /* CUdeviceptr */
    unsigned n = N;
    void *params[] = {(void *)&a, &x, &y, &n};
    CHECK_CU(cuLaunchKernel(saxpy, 1, 1, 1, 128, 1, 1, 0, stream_handle, params, NULL));

    float *cpu_result; /* page-locked: the copy back is a DMA on the same stream */
    CHECK(mapping_allocate_cpu(dev, sizeof cpu_y, (void **)&cpu_result));
    CHECK(mapping_sync_to_cpu_range(stream, gpu_y, 0, cpu_result, sizeof cpu_y)); /* GPU -> CPU, after the kernel */
    CHECK(mapping_stream_synchronize(stream));
    printf("cpu_result = %g * [%g, %g, %g] + [%g, %g, %g] = [%g, %g, %g]\n", a, cpu_x[0], cpu_x[1], cpu_x[2],
           cpu_y[0], cpu_y[1], cpu_y[2], cpu_result[0], cpu_result[1], cpu_result[2]);
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= cpu_result[i] == a * cpu_x[i] + cpu_y[i];

    CHECK_CU(cuModuleUnload(module));
    CUcontext popped;
    CHECK_CU(cuCtxPopCurrent_v2(&popped));
    mapping_free_cpu(dev, cpu_result);
    mapping_stream_destroy(stream);
    mapping_free_gpu(gpu_x);
    mapping_free_gpu(gpu_y);
    mapping_close(dev);
    printf("%s\n", ok ? "OK" : "WRONG RESULT");
    return ok ? 0 : 1;
}
