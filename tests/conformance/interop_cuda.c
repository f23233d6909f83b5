/* CUDA interop: the back end runs in the device's primary context, which
 * the CUDA runtime, PyTorch and CuPy share, so a pointer and a stream they
 * made (here: made through the driver API in that context, as the runtime
 * does) are accepted by mapping_import_gpu / mapping_import_stream. Runs on
 * the CUDA back end (and on the fake driver in CI); elsewhere SKIP. */
#include "harness.h"

typedef int                cu_result_t;
typedef unsigned long long cu_deviceptr_t;

static struct {
    cu_result_t (*cuCtxPushCurrent_v2)(void *ctx);
    cu_result_t (*cuCtxPopCurrent_v2)(void **ctx);
    cu_result_t (*cuMemAlloc_v2)(cu_deviceptr_t *p, size_t bytes);
    cu_result_t (*cuMemFree_v2)(cu_deviceptr_t p);
    cu_result_t (*cuStreamCreate)(void **s, unsigned flags);
    cu_result_t (*cuStreamDestroy_v2)(void *s);
} cu;

TEST(cuda_runtime_pointer_and_stream_are_accepted_by_import)
{
    if (strcmp(test_backend(), "cuda") != 0)
        test_skip("needs the CUDA back end (this run is on %s)", test_backend());
    mapping_device *dev = test_device();
    void *lib = test_cuda_driver();
#define CU_LOAD_(name) TEST_CU_LOAD(cu, lib, name);
    CU_LOAD_(cuCtxPushCurrent_v2) CU_LOAD_(cuCtxPopCurrent_v2) CU_LOAD_(cuMemAlloc_v2) CU_LOAD_(cuMemFree_v2)
    CU_LOAD_(cuStreamCreate) CU_LOAD_(cuStreamDestroy_v2)
#undef CU_LOAD_
    mapping_native_device native;
    CHECK_OK(mapping_device_native(dev, &native));
    CHECK(native.context != NULL);

    /* "The runtime's" allocation and stream, in the primary context. */
    const size_t n = 1 << 20;
    cu_deviceptr_t ptr = 0;
    void *stream = NULL, *popped;
    CHECK(cu.cuCtxPushCurrent_v2(native.context) == 0);
    CHECK(cu.cuMemAlloc_v2(&ptr, n) == 0);
    CHECK(cu.cuStreamCreate(&stream, 0) == 0);
    CHECK(cu.cuCtxPopCurrent_v2(&popped) == 0);

    mapping_buffer *buf;
    CHECK_OK(mapping_import_gpu(dev, (void *)(uintptr_t)ptr, 0, n, NULL, NULL, &buf));
    void *native_ptr;
    CHECK_OK(mapping_buffer_native(buf, &native_ptr));
    CHECK((uintptr_t)native_ptr == ptr);
    mapping_stream *s;
    CHECK_OK(mapping_import_stream(dev, stream, &s));

    unsigned char *src = malloc(n), *back = malloc(n);
    test_pattern(src, n, 17);
    CHECK_OK(mapping_sync_to_gpu_range(s, src, buf, 0, n));
    CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, back, n));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_BYTES(back, src, n);
    mapping_stream_destroy(s);
    mapping_free_gpu(buf);

    /* Both are still the caller's to use and to free. */
    CHECK(cu.cuCtxPushCurrent_v2(native.context) == 0);
    CHECK(cu.cuStreamDestroy_v2(stream) == 0);
    CHECK(cu.cuMemFree_v2(ptr) == 0);
    CHECK(cu.cuCtxPopCurrent_v2(&popped) == 0);
    free(src);
    free(back);
}
