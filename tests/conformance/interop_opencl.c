/* OpenCL interop with real kernels: the caller's context (mapping_open_opencl),
 * cl_mem and queues made outside the library, and the NULL-stream contract
 * for a kernel the caller enqueued on the device's own queue. The OpenCL
 * library is loaded with dlopen, as the library itself does; on other back
 * ends these tests SKIP. */
#include "harness.h"
#include <dlfcn.h>

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define TEST_HAVE_CL 1
#endif
#endif

#ifdef TEST_HAVE_CL
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>

#define CL_CALLS(X)                                                                                      \
    X(clCreateContext) X(clReleaseContext) X(clCreateCommandQueue) X(clReleaseCommandQueue)              \
    X(clCreateBuffer) X(clReleaseMemObject) X(clEnqueueReadBuffer) X(clEnqueueWriteBuffer)               \
    X(clCreateProgramWithSource) X(clBuildProgram) X(clReleaseProgram) X(clCreateKernel)                 \
    X(clReleaseKernel) X(clSetKernelArg) X(clEnqueueNDRangeKernel) X(clFlush) X(clFinish)

static struct {
#define CL_FIELD_(name) __typeof__(&name) name;
    CL_CALLS(CL_FIELD_)
#undef CL_FIELD_
} cl;

/* The device (OpenCL only, else SKIP) and the OpenCL library's entry points. */
static mapping_device *opencl_device(mapping_native_device *native)
{
    if (strcmp(test_backend(), "opencl") != 0)
        test_skip("needs the OpenCL back end to launch a kernel (this run is on %s)", test_backend());
    mapping_device *dev = test_device();
    const char *path = getenv("MAPPING_OPENCL_LIBRARY");
    void *lib = dlopen(path && *path ? path : "libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        test_skip("cannot load the OpenCL library: %s", dlerror());
#define CL_LOAD_(name)                                                      \
    {                                                                       \
        void *sym = dlsym(lib, #name);                                      \
        if (!sym)                                                           \
            test_skip("the OpenCL library has no %s", #name);               \
        memcpy(&cl.name, &sym, sizeof sym);                                 \
    }
    CL_CALLS(CL_LOAD_)
#undef CL_LOAD_
    CHECK_OK(mapping_device_native(dev, native));
    return dev;
}

/* x[i] = LCG applied `rounds` times: integer arithmetic, so the CPU model
 * is exact; enough rounds that the kernel outlasts the calls after it. */
static const char *kernel_source =
    "__kernel void scramble(__global uint *x, uint rounds) {\n"
    "    size_t i = get_global_id(0);\n"
    "    uint v = x[i];\n"
    "    for (uint k = 0; k < rounds; k++) v = v * 1664525u + 1013904223u;\n"
    "    x[i] = v;\n"
    "}\n";

static cl_kernel build_kernel(cl_context context, cl_device_id device, cl_program *program)
{
    cl_int err;
    *program = cl.clCreateProgramWithSource(context, 1, &kernel_source, NULL, &err);
    CHECK(err == CL_SUCCESS);
    CHECK(cl.clBuildProgram(*program, 1, &device, "", NULL, NULL) == CL_SUCCESS);
    cl_kernel k = cl.clCreateKernel(*program, "scramble", &err);
    CHECK(err == CL_SUCCESS);
    return k;
}

static void scramble_model(uint32_t *x, size_t n, uint32_t rounds)
{
    for (size_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < rounds; k++)
            x[i] = x[i] * 1664525u + 1013904223u;
}

static void launch(cl_command_queue q, cl_kernel k, cl_mem mem, size_t n, cl_uint rounds)
{
    CHECK(cl.clSetKernelArg(k, 0, sizeof mem, &mem) == CL_SUCCESS);
    CHECK(cl.clSetKernelArg(k, 1, sizeof rounds, &rounds) == CL_SUCCESS);
    CHECK(cl.clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL) == CL_SUCCESS);
    CHECK(cl.clFlush(q) == CL_SUCCESS);
}

/* The scenario: a kernel on the device's own queue, then
 * release_gpu(NULL) and sync_to_cpu(NULL). Exact for ordinary and unified
 * mirrors. */
static void native_queue_case(void)
{
    mapping_native_device native;
    mapping_device *dev = opencl_device(&native);
    cl_program program;
    cl_kernel k = build_kernel(native.context, native.device, &program);
    const size_t n = (size_t)1 << 20; /* 1 Mi uint32 */
    const cl_uint rounds = 32;
    uint32_t *model = malloc(n * sizeof *model);
    const unsigned kinds[2] = {0, MAPPING_MIRROR_UNIFIED};
    int unified_seen = 0;
    for (int kind = 0; kind < 2; kind++) {
        for (int run = 0; run < 2; run++) {
            mapping_mirror *m = test_synced_mirror(dev, n * sizeof *model, kinds[kind], 40 + run);
            unified_seen |= mapping_mirror_is_unified(m);
            memcpy(model, mapping_mirror_cpu(m), n * sizeof *model);
            scramble_model(model, n, rounds);
            mapping_buffer *buf;
            CHECK_OK(mapping_mirror_acquire_gpu(NULL, m, MAPPING_READ | MAPPING_WRITE, &buf));
            void *mem;
            CHECK_OK(mapping_buffer_native(buf, &mem));
            launch(native.queue, k, mem, n, rounds);
            CHECK_OK(mapping_mirror_release_gpu(NULL, m));
            CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
            const uint32_t *cpu = mapping_mirror_cpu(m);
            size_t wrong = 0;
            for (size_t i = 0; i < n; i++)
                wrong += cpu[i] != model[i];
            if (wrong)
                test_fail(__FILE__, __LINE__, "%s mirror, run %d: %zu of %zu values wrong",
                          mapping_mirror_is_unified(m) ? "unified" : "ordinary", run, wrong, n);
            mapping_mirror_destroy(m);
        }
    }
    printf("checked: ordinary mirrors%s\n", unified_seen ? " and unified mirrors" : " (no unified memory here)");
    free(model);
    cl.clReleaseKernel(k);
    cl.clReleaseProgram(program);
}

/* A context, buffer and queue made with OpenCL directly: the library opens on
 * them, imports them, orders its copies after the caller's kernel on the
 * caller's queue, and leaves them alive. */
static void open_opencl_case(void)
{
    mapping_native_device native;
    mapping_device *first = opencl_device(&native);
    (void)first;
    cl_int err;
    cl_device_id device = native.device;
    cl_context ctx = cl.clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    CHECK(err == CL_SUCCESS);
    cl_command_queue q = cl.clCreateCommandQueue(ctx, device, 0, &err);
    CHECK(err == CL_SUCCESS);
    const size_t n = (size_t)1 << 18;
    const size_t bytes = n * sizeof(uint32_t);
    cl_mem mem = cl.clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    CHECK(err == CL_SUCCESS);
    cl_program program;
    cl_kernel k = build_kernel(ctx, device, &program);

    mapping_device *dev;
    CHECK_OK(mapping_open_opencl(ctx, device, q, &dev));
    mapping_native_device got;
    CHECK_OK(mapping_device_native(dev, &got));
    CHECK(got.context == ctx && got.device == device && got.queue == q);
    mapping_device_info info;
    CHECK_OK(mapping_device_get_info(dev, &info));
    CHECK(strcmp(info.backend, "opencl") == 0);

    /* The caller's cl_mem as a buffer; a buffer of another context is refused. */
    mapping_buffer *buf, *foreign = (mapping_buffer *)1;
    CHECK_OK(mapping_import_gpu(dev, mem, 0, bytes, NULL, NULL, &buf));
    mapping_buffer *own;
    CHECK_OK(mapping_allocate_gpu(first, 4096, &own));
    void *own_mem;
    CHECK_OK(mapping_buffer_native(own, &own_mem));
    CHECK_REFUSED(mapping_import_gpu(dev, own_mem, 0, 4096, NULL, NULL, &foreign), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK(foreign == NULL);
    CHECK_REFUSED(mapping_import_gpu(dev, mem, 0, bytes + 1, NULL, NULL, &foreign), MAPPING_ERR_OUT_OF_RANGE);
    mapping_free_gpu(own);

    uint32_t *data = malloc(bytes), *model = malloc(bytes), *back = malloc(bytes);
    test_pattern(data, bytes, 9);
    memcpy(model, data, bytes);
    scramble_model(model, n, 32);
    CHECK_OK(mapping_sync_to_gpu(data, buf));

    /* The caller's kernel on the caller's queue, then the library's read on
     * the same queue imported as a stream: in order, no wait in between. */
    mapping_stream *s;
    CHECK_OK(mapping_import_stream(dev, q, &s));
    launch(q, k, mem, n, 32);
    CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, back, bytes));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_BYTES(back, model, bytes);
    mapping_stream_destroy(s);

    /* A mirror over the caller's host array and the caller's cl_mem. */
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_adopt(dev, data, buf, 0, bytes, MAPPING_MIRROR_GPU_VALID, &m));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK_BYTES(data, model, bytes);
    mapping_mirror_destroy(m);

    mapping_free_gpu(buf);
    mapping_close(dev);
    /* Still the caller's: the buffer and queue work after the library let go. */
    memset(back, 0, bytes);
    CHECK(cl.clEnqueueReadBuffer(q, mem, CL_TRUE, 0, bytes, back, 0, NULL, NULL) == CL_SUCCESS);
    CHECK_BYTES(back, model, bytes);

    /* Without a queue the device makes its own on the caller's context. */
    CHECK_OK(mapping_open_opencl(ctx, device, NULL, &dev));
    CHECK_OK(mapping_device_native(dev, &got));
    CHECK(got.context == ctx && got.queue != NULL && got.queue != q);
    CHECK_OK(mapping_import_gpu(dev, mem, 0, bytes, NULL, NULL, &buf));
    memset(back, 0, bytes);
    CHECK_OK(mapping_sync_to_cpu(buf, back));
    CHECK_BYTES(back, model, bytes);
    mapping_free_gpu(buf);
    mapping_close(dev);

    /* Refusals: a device not in the context; an out-of-order queue. */
    cl_context other = cl.clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    CHECK(err == CL_SUCCESS);
    CHECK_REFUSED(mapping_open_opencl(other, device, q, &dev), MAPPING_ERR_DEVICE_MISMATCH);
    cl_command_queue ooo = cl.clCreateCommandQueue(ctx, device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    if (err == CL_SUCCESS) {
        CHECK_REFUSED(mapping_open_opencl(ctx, device, ooo, &dev), MAPPING_ERR_INVALID_ARGUMENT);
        cl.clReleaseCommandQueue(ooo);
    }
    cl.clReleaseContext(other);

    cl.clReleaseKernel(k);
    cl.clReleaseProgram(program);
    cl.clReleaseMemObject(mem);
    cl.clReleaseCommandQueue(q);
    cl.clReleaseContext(ctx);
    free(data);
    free(model);
    free(back);
}
#endif

TEST(native_queue_kernel_then_null_stream_release_and_sync_is_exact)
{
#ifdef TEST_HAVE_CL
    native_queue_case();
#else
    test_skip("built without the OpenCL headers (CL/cl.h)");
#endif
}

TEST(open_opencl_adopts_the_callers_context_buffers_and_queue)
{
#ifdef TEST_HAVE_CL
    open_opencl_case();
#else
    test_skip("built without the OpenCL headers (CL/cl.h)");
#endif
}
