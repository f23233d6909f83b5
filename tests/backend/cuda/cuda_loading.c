/*
 * The cuda back end without a GPU: a driver that cannot be loaded, or the
 * toolkit's stub library, makes cuda unavailable with a reason, and the
 * library goes on with the other back ends. Each test runs in its own process,
 * so setting MAPPING_CUDA_LIBRARY before the first call decides what loads.
 */
#include <unistd.h>
#include "harness.h"
#ifdef MAPPING_WITH_CUDA
#include "backend/cuda/cuda_driver.h"
#endif

static mapping_backend_info cuda_info(void)
{
    mapping_backend_info all[8];
    int count = 0;
    CHECK_OK(mapping_list_backends(all, 8, &count));
    for (int i = 0; i < count && i < 8; i++)
        if (strcmp(all[i].name, "cuda") == 0)
            return all[i];
    test_fail(__FILE__, __LINE__, "mapping_list_backends does not list cuda");
}

static mapping_backend_info cuda_info_with_library(const char *path)
{
    CHECK(setenv("MAPPING_CUDA_LIBRARY", path, 1) == 0);
    mapping_backend_info info = cuda_info();
    if (!info.compiled)
        test_skip("the cuda back end is not compiled into this build");
    return info;
}

/* The host back end still opens and moves data. */
static void check_host_still_works(void)
{
    mapping_device *dev;
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = "host"}, &dev));
    unsigned char in[100], out[100];
    test_pattern(in, sizeof in, 40);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, sizeof in, &buf));
    CHECK_OK(mapping_sync_to_gpu(in, buf));
    CHECK_OK(mapping_sync_to_cpu(buf, out));
    CHECK_BYTES(out, in, sizeof in);
    mapping_free_gpu(buf);
    mapping_close(dev);
}

UNIT_TEST(cuda_library_that_cannot_be_opened_makes_cuda_unavailable_naming_the_path)
{
    const char *path = "/nonexistent/mapping-test/libcuda.so.1";
    mapping_backend_info info = cuda_info_with_library(path);
    CHECK(!info.available);
    CHECK(info.device_count == 0);
    CHECK(strstr(info.reason, path) != NULL);
    CHECK(strstr(info.reason, "MAPPING_CUDA_LIBRARY") != NULL);

    mapping_device *dev = NULL;
    CHECK_STATUS(mapping_open(&(mapping_device_desc){.backend = "cuda"}, &dev), MAPPING_ERR_NO_BACKEND);
    CHECK(dev == NULL);
    CHECK(strstr(mapping_last_error_message(), path) != NULL);
    int n = -1;
    CHECK_OK(mapping_list_devices("cuda", NULL, 0, &n));
    CHECK(n == 0);
    check_host_still_works();
}

/* A driver without one of the entry points the back end needs (the loader's
 * lists in cuda_driver.h): unavailable, naming the missing symbol. */
UNIT_TEST(cuda_driver_lacking_a_required_entry_point_makes_cuda_unavailable_naming_it)
{
    const char *path = getenv("MAPPING_TEST_FAKE_CUDA_INCOMPLETE");
    if (!path || !*path)
        test_skip("no incomplete fake libcuda (it is built with the cuda back end)");
    mapping_backend_info info = cuda_info_with_library(path);
    CHECK(!info.available);
    CHECK(info.device_count == 0);
    CHECK(strstr(info.reason, "cuStreamWaitEvent") != NULL);
    CHECK(strstr(info.reason, "too old") != NULL);
    CHECK_STATUS(mapping_open(&(mapping_device_desc){.backend = "cuda"}, &(mapping_device *){NULL}),
                 MAPPING_ERR_NO_BACKEND);
    check_host_still_works();
}

/* The stub libcuda.so of the toolkit exports every symbol, and its cuInit
 * answers CUDA_ERROR_STUB_LIBRARY: a build machine's usual trap. */
UNIT_TEST(cuda_toolkit_stub_library_makes_cuda_unavailable_with_a_clear_reason)
{
    const char *candidates[] = {"/usr/local/cuda/lib64/stubs/libcuda.so",
                                "/usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so",
                                "/usr/lib/x86_64-linux-gnu/stubs/libcuda.so"};
    const char *stub = NULL;
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && !stub; i++)
        if (access(candidates[i], R_OK) == 0)
            stub = candidates[i];
    if (!stub)
        test_skip("no CUDA toolkit stub library (libcuda.so under stubs/) on this machine");
    unsetenv("MAPPING_BACKEND"); /* the default device below is the library's choice */
    mapping_backend_info info = cuda_info_with_library(stub);
    CHECK(!info.available);
    CHECK(strstr(info.reason, "CUDA_ERROR_STUB_LIBRARY") != NULL);
    CHECK(strstr(info.reason, "stub") != NULL);
    CHECK_STATUS(mapping_open(&(mapping_device_desc){.backend = "cuda"}, &(mapping_device *){NULL}),
                 MAPPING_ERR_NO_BACKEND);
    /* The best available back end is chosen instead. */
    mapping_device *dev;
    CHECK_OK(mapping_open(NULL, &dev));
    CHECK(strcmp(mapping_backend_name(dev), "cuda") != 0);
    mapping_close(dev);
    check_host_still_works();
}

UNIT_TEST(cuda_error_names_are_known_without_a_driver)
{
#ifdef MAPPING_WITH_CUDA
    CHECK(strcmp(mapping__cuda_error_name(2), "CUDA_ERROR_OUT_OF_MEMORY") == 0);
    CHECK(strcmp(mapping__cuda_error_name(34), "CUDA_ERROR_STUB_LIBRARY") == 0);
    CHECK(strcmp(mapping__cuda_error_name(600), "CUDA_ERROR_NOT_READY") == 0);
    CHECK(strcmp(mapping__cuda_error_name(123456), "unknown CUresult") == 0);
#else
    test_skip("the cuda back end is not compiled into this build");
#endif
}
