/* A program that defines names the library once exported from its static
 * archive (ocl, host_submit, opencl_read, cuda_check, ...) still links with
 * it statically, and runs. */
#include <mapping.h>
#include <stdio.h>

int ocl = 1, ocl_read = 2, host_submit = 3, opencl_read = 4, opencl_write = 5, cuda_check = 6, cuda_enter = 7,
    host_scatter = 8, opencl_driver = 9, cuda_driver_load = 10;

int main(void)
{
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    if (mapping_open(&desc, &dev) != MAPPING_OK)
        return 1;
    char in[8] = "static", out[8] = {0};
    mapping_buffer *buf;
    int ok = mapping_allocate_gpu(dev, sizeof in, &buf) == MAPPING_OK && mapping_sync_to_gpu(in, buf) == MAPPING_OK &&
             mapping_sync_to_cpu(buf, out) == MAPPING_OK && out[0] == 's';
    mapping_free_gpu(buf);
    mapping_close(dev);
    printf("%s (%d)\n", ok ? "ok" : "FAILED", ocl + ocl_read + host_submit + opencl_read + opencl_write + cuda_check +
                                                  cuda_enter + host_scatter + opencl_driver + cuda_driver_load);
    return ok ? 0 : 1;
}
