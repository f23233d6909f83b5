/* Built against an installed mapping, outside the tree. */
#include <mapping.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    if (mapping_open(&desc, &dev) != MAPPING_OK)
        return 1;
    char in[16] = "installed", out[16] = {0};
    mapping_buffer *buf;
    int ok = mapping_allocate_gpu(dev, sizeof in, &buf) == MAPPING_OK && mapping_sync_to_gpu(in, buf) == MAPPING_OK &&
             mapping_sync_to_cpu(buf, out) == MAPPING_OK && strcmp(in, out) == 0;
    mapping_free_gpu(buf);
    mapping_close(dev);
    printf("%s\n", ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
