/*
 * Program binaries kept between processes: building the scatter/gather
 * kernels from source costs PoCL 20-100 ms per opened device (clang and
 * LLVM at work), against about 1 ms from a binary. The binary is kept in the
 * per-user cache directory (os/cache_file.c), in a file named by a hash of
 * everything it depends on: the platform, the device, its OpenCL and driver
 * versions, the kernel source and the build options. A file that is short,
 * corrupt (checksum), of another key, or that the driver refuses is simply
 * ignored and rewritten from a fresh source build. Writes are atomic (a
 * temporary file and rename), so processes racing to fill the cache are safe.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/opencl/opencl_internal.h"
#include "os/os.h"
#ifdef MAPPING_OPENCL_HEADERS

enum { MAX_BINARY = 64 << 20 };
static const char MAGIC[8] = {'m', 'a', 'p', 'c', 'l', 'b', 'n', '1'};

typedef struct cache_header {
    char     magic[8];
    uint64_t key, size, check; /* the key again, the binary's bytes, its hash */
} cache_header;

static uint64_t hash_info(uint64_t h, bool device, opencl_device *d, cl_uint param)
{
    char text[512] = "";
    cl_int err = device ? mapping__opencl_driver.clGetDeviceInfo(d->device, param, sizeof text - 1, text, NULL)
                        : mapping__opencl_driver.clGetPlatformInfo(d->platform, param, sizeof text - 1, text, NULL);
    if (err != CL_SUCCESS)
        text[0] = '\0';
    return mapping_os_hash64(text, strlen(text) + 1, h);
}

static uint64_t cache_key(opencl_device *d, const char *source, const char *options)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = hash_info(h, false, d, CL_PLATFORM_NAME);
    h = hash_info(h, false, d, CL_PLATFORM_VERSION);
    h = hash_info(h, true, d, CL_DEVICE_NAME);
    h = hash_info(h, true, d, CL_DEVICE_VENDOR);
    h = hash_info(h, true, d, CL_DEVICE_VERSION);
    h = hash_info(h, true, d, CL_DRIVER_VERSION);
    h = mapping_os_hash64(source, strlen(source) + 1, h);
    return mapping_os_hash64(options, strlen(options) + 1, h);
}

static bool cache_file(uint64_t key, char *path, size_t len)
{
    char name[64];
    snprintf(name, sizeof name, "opencl-%016llx.bin", (unsigned long long)key);
    return mapping_os_cache_path(name, path, len) == 0;
}

cl_program mapping__opencl_program_from_cache(opencl_device *d, const char *source, const char *options)
{
    if (!mapping__opencl_driver.clCreateProgramWithBinary || !mapping__opencl_driver.clGetProgramInfo)
        return NULL;
    uint64_t key = cache_key(d, source, options);
    char path[4200];
    size_t len = 0;
    unsigned char *file;
    if (!cache_file(key, path, sizeof path) || !(file = mapping_os_read_file(path, MAX_BINARY, &len)))
        return NULL;
    cache_header h;
    cl_program program = NULL;
    if (len > sizeof h) {
        memcpy(&h, file, sizeof h);
        const unsigned char *binary = file + sizeof h;
        size_t size = len - sizeof h;
        if (!memcmp(h.magic, MAGIC, sizeof MAGIC) && h.key == key && h.size == size &&
            h.check == mapping_os_hash64(binary, size, 0xcbf29ce484222325ull)) {
            cl_int err = CL_SUCCESS, status = CL_SUCCESS;
            program = mapping__opencl_driver.clCreateProgramWithBinary(d->context, 1, &d->device, &size, &binary, &status, &err);
            if (err != CL_SUCCESS || status != CL_SUCCESS) {
                if (err == CL_SUCCESS)
                    mapping__opencl_driver.clReleaseProgram(program);
                program = NULL;
            } else if (mapping__opencl_driver.clBuildProgram(program, 1, &d->device, options, NULL, NULL) != CL_SUCCESS) {
                mapping__opencl_driver.clReleaseProgram(program);
                program = NULL;
            }
        }
    }
    free(file);
    return program;
}

void mapping__opencl_program_to_cache(opencl_device *d, cl_program program, const char *source, const char *options)
{
    if (!mapping__opencl_driver.clGetProgramInfo)
        return;
    size_t size = 0;
    if (mapping__opencl_driver.clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != CL_SUCCESS ||
        size == 0 || size > MAX_BINARY)
        return;
    uint64_t key = cache_key(d, source, options);
    char path[4200];
    unsigned char *file = mapping_os_malloc(sizeof(cache_header) + size);
    if (!file)
        return;
    unsigned char *binary = file + sizeof(cache_header);
    if (cache_file(key, path, sizeof path) &&
        mapping__opencl_driver.clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof binary, &binary, NULL) == CL_SUCCESS) {
        cache_header h = {.key = key, .size = size, .check = mapping_os_hash64(binary, size, 0xcbf29ce484222325ull)};
        memcpy(h.magic, MAGIC, sizeof MAGIC);
        memcpy(file, &h, sizeof h);
        mapping_os_write_file_atomic(path, file, sizeof h + size); /* no cache is not an error */
    }
    free(file);
}
#endif /* MAPPING_OPENCL_HEADERS */
