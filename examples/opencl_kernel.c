/*
 * The seed's scenario with a real OpenCL kernel: allocate on the GPU, sync
 * the CPU data to it, run a kernel built from source at run time on the
 * library's stream (through the native handles), sync the result back to
 * page-locked CPU memory, print it. Exits 77 (SKIP) where OpenCL is absent.
 *
 * Like the library, this program does not link OpenCL: it loads the same
 * libOpenCL the library loaded and takes the few entry points it needs.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "mapping.h"

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define HAVE_CL_HEADERS 1
#endif
#endif

#ifndef HAVE_CL_HEADERS
int main(void)
{
    printf("SKIP: built without the OpenCL headers\n");
    return 77;
}
#else
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#define CHECK_CL(call)                                                \
    do {                                                              \
        cl_int e_ = (call);                                           \
        if (e_ != CL_SUCCESS) {                                       \
            fprintf(stderr, "%s failed with %d\n", #call, (int)e_);  \
            return 1;                                                 \
        }                                                             \
    } while (0)

/* The OpenCL calls this program makes, resolved at run time. */
#define ENTRY_POINTS(X)                                                                                     \
    X(clCreateProgramWithSource) X(clBuildProgram) X(clGetProgramBuildInfo) X(clCreateKernel)              \
    X(clSetKernelArg) X(clEnqueueNDRangeKernel) X(clReleaseKernel) X(clReleaseProgram)
static struct {
#define FIELD_(name) __typeof__(&name) name;
    ENTRY_POINTS(FIELD_)
#undef FIELD_
} cl;

static int load_opencl(void)
{
    const char *path = getenv("MAPPING_OPENCL_LIBRARY");
    void *lib = dlopen(path && *path ? path : "libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib && !(path && *path))
        lib = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 0;
#define RESOLVE_(name)                          \
    {                                           \
        void *sym = dlsym(lib, #name);          \
        if (!sym)                               \
            return 0;                           \
        memcpy(&cl.name, &sym, sizeof sym);     \
    }
    ENTRY_POINTS(RESOLVE_)
#undef RESOLVE_
    return 1;
}

static const char *kernel_source =
    "__kernel void square_plus_one(__global float *x)\n"
    "{\n"
    "    size_t i = get_global_id(0);\n"
    "    x[i] = x[i] * x[i] + 1.0f;\n"
    "}\n";

int main(void)
{
    mapping_device *dev;
    if (mapping_open(&(mapping_device_desc){.backend = "opencl"}, &dev) != MAPPING_OK) {
        printf("SKIP: OpenCL is not available: %s\n", mapping_last_error_message());
        return 77;
    }
    if (!load_opencl()) {
        printf("SKIP: cannot load the OpenCL entry points: %s\n", dlerror());
        mapping_close(dev);
        return 77;
    }
    mapping_device_info info;
    CHECK(mapping_device_get_info(dev, &info));
    printf("back end: %s, device: %s\n", mapping_backend_name(dev), info.name);

    float cpu_data[3] = {1.0f, 2.0f, 3.0f}; /* data in CPU memory */
    mapping_buffer *gpu_tensor;
    mapping_stream *stream;
    CHECK(mapping_allocate_gpu(dev, sizeof cpu_data, &gpu_tensor));
    CHECK(mapping_stream_create(dev, &stream));
    CHECK(mapping_sync_to_gpu_range(stream, cpu_data, gpu_tensor, 0, sizeof cpu_data)); /* CPU -> GPU */

    /* The library's objects as OpenCL objects. */
    mapping_native_device native;
    void *mem, *queue;
    CHECK(mapping_device_native(dev, &native));
    CHECK(mapping_buffer_native(gpu_tensor, &mem));
    CHECK(mapping_stream_native(stream, &queue));

    /* A kernel built from source now, queued on the library's stream: it runs
     * after the upload and before the download, in stream order. */
    cl_int err = CL_SUCCESS;
    cl_device_id device = native.device;
    cl_program program = cl.clCreateProgramWithSource(native.context, 1, &kernel_source, NULL, &err);
    CHECK_CL(err);
    if (cl.clBuildProgram(program, 1, &device, "", NULL, NULL) != CL_SUCCESS) {
        char log[2048] = "";
        cl.clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
        fprintf(stderr, "clBuildProgram failed:\n%s\n", log);
        return 1;
    }
    cl_kernel kernel = cl.clCreateKernel(program, "square_plus_one", &err);
    CHECK_CL(err);
    cl_mem buffer = mem;
    size_t global = sizeof cpu_data / sizeof cpu_data[0];
    CHECK_CL(cl.clSetKernelArg(kernel, 0, sizeof buffer, &buffer));
    CHECK_CL(cl.clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &global, NULL, 0, NULL, NULL));

    float *cpu_result;
    CHECK(mapping_allocate_cpu(dev, sizeof cpu_data, (void **)&cpu_result)); /* page-locked */
    CHECK(mapping_sync_to_cpu_range(stream, gpu_tensor, 0, cpu_result, sizeof cpu_data)); /* GPU -> CPU */
    CHECK(mapping_stream_synchronize(stream));
    printf("cpu_result = [%g, %g, %g]\n", cpu_result[0], cpu_result[1], cpu_result[2]);

    int ok = cpu_result[0] == 2.0f && cpu_result[1] == 5.0f && cpu_result[2] == 10.0f;
    cl.clReleaseKernel(kernel);
    cl.clReleaseProgram(program);
    mapping_free_cpu(dev, cpu_result);
    mapping_stream_destroy(stream);
    mapping_free_gpu(gpu_tensor);
    mapping_close(dev);
    return ok ? 0 : 1;
}
#endif
