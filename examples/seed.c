/*
 * The seed's scenario: allocate on the GPU, sync the CPU data to it, run a
 * device-side step, allocate on the CPU, sync the result back, print it.
 * Runs on the default back end ($MAPPING_BACKEND to choose).
 */
#include <stdio.h>
#include "check.h"
#include "mapping.h"

int main(void)
{
    mapping_device *dev;
    CHECK(mapping_open(NULL, &dev));
    printf("back end: %s\n", mapping_backend_name(dev));

    float cpu_data[3] = {1.0f, 2.0f, 3.0f};                 /* data in CPU memory */
    mapping_buffer *gpu_tensor;
    CHECK(mapping_allocate_gpu(dev, 2 * sizeof cpu_data, &gpu_tensor)); /* room for input and result */
    CHECK(mapping_sync_to_gpu_range(NULL, cpu_data, gpu_tensor, 0, sizeof cpu_data)); /* CPU -> GPU */

    /* A device-side step: the "kernel" here is a device-to-device copy of the
     * input into the result half (examples/opencl_kernel.c runs a real one). */
    CHECK(mapping_copy_gpu(NULL, gpu_tensor, 0, gpu_tensor, sizeof cpu_data, sizeof cpu_data));

    float *cpu_result;
    CHECK(mapping_allocate_cpu(dev, sizeof cpu_data, (void **)&cpu_result)); /* page-locked */
    CHECK(mapping_sync_to_cpu_range(NULL, gpu_tensor, sizeof cpu_data, cpu_result, sizeof cpu_data)); /* GPU -> CPU */
    printf("cpu_result = [%g, %g, %g]\n", cpu_result[0], cpu_result[1], cpu_result[2]);

    int ok = cpu_result[0] == 1.0f && cpu_result[1] == 2.0f && cpu_result[2] == 3.0f;
    mapping_free_cpu(dev, cpu_result);
    mapping_free_gpu(gpu_tensor);
    mapping_close(dev);
    return ok ? 0 : 1;
}
