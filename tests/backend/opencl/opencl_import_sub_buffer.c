/*
 * Importing a cl_mem that is itself a sub-buffer: whole (offset 0) it is an
 * ordinary buffer; a sub-range of it would be a sub-buffer of a sub-buffer,
 * which OpenCL cannot make (clCreateSubBuffer answers CL_INVALID_MEM_OBJECT),
 * so the import says that, with the parent and the offset that work
 * instead, rather than a raw driver error.
 */
#include "harness.h"
#ifdef MAPPING_WITH_OPENCL
#include "backend/opencl/opencl_api.h"
#endif

UNIT_TEST(opencl_import_of_a_sub_range_of_a_sub_buffer_says_opencl_cannot_make_it)
{
#ifdef MAPPING_OPENCL_HEADERS
    mapping_device *dev = NULL;
    mapping_status st = mapping_open(&(mapping_device_desc){.backend = "opencl"}, &dev);
    if (st == MAPPING_ERR_NO_BACKEND || st == MAPPING_ERR_NO_DEVICE)
        test_skip("OpenCL is not available here: %s", mapping_last_error_message());
    CHECK_OK(st);
    mapping_native_device native;
    CHECK_OK(mapping_device_native(dev, &native));
    cl_uint bits = 0;
    CHECK(mapping__opencl_driver.clGetDeviceInfo(native.device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits,
                                                 NULL) == CL_SUCCESS);
    size_t align = bits / 8 ? bits / 8 : 128;
    mapping_buffer *whole;
    CHECK_OK(mapping_allocate_gpu(dev, 8 * align, &whole));
    void *parent = NULL;
    CHECK_OK(mapping_buffer_native(whole, &parent));
    cl_int err = CL_SUCCESS;
    cl_buffer_region region = {2 * align, 4 * align};
    cl_mem sub = mapping__opencl_driver.clCreateSubBuffer((cl_mem)parent, 0, CL_BUFFER_CREATE_TYPE_REGION, &region,
                                                          &err);
    CHECK(err == CL_SUCCESS && sub);

    /* Whole: works, and reaches the parent's bytes 2*align.. */
    unsigned char in[64], out[64];
    test_pattern(in, sizeof in, 5);
    mapping_buffer *imported;
    CHECK_OK(mapping_import_gpu(dev, sub, 0, 4 * align, NULL, NULL, &imported));
    CHECK_OK(mapping_sync_to_gpu_range(NULL, in, imported, 0, sizeof in));
    CHECK_OK(mapping_sync_to_cpu_range(NULL, whole, 2 * align, out, sizeof out));
    CHECK_BYTES(out, in, sizeof in);
    mapping_free_gpu(imported);

    /* A sub-range: refused, naming why and what works. */
    mapping_buffer *refused = (mapping_buffer *)1;
    CHECK_REFUSED(mapping_import_gpu(dev, sub, align, align, NULL, NULL, &refused), MAPPING_ERR_UNSUPPORTED);
    CHECK(refused == NULL);
    const char *message = mapping_last_error_message();
    char expected[160];
    snprintf(expected, sizeof expected, "import its parent at offset %zu", 3 * align);
    if (!strstr(message, "sub-buffer of a sub-buffer") || !strstr(message, expected))
        test_fail(__FILE__, __LINE__, "message: %s", message);
    /* ... and the advice works. */
    CHECK_OK(mapping_import_gpu(dev, parent, 3 * align, align, NULL, NULL, &imported));
    mapping_free_gpu(imported);

    mapping__opencl_driver.clReleaseMemObject(sub);
    mapping_free_gpu(whole);
    mapping_close(dev);
#else
    test_skip("the OpenCL back end is not compiled into this build (or without its headers)");
#endif
}
