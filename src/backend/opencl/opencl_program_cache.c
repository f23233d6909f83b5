/*
 * Program binaries kept between processes: building the scatter/gather
 * kernels from source costs PoCL 20-100 ms per opened device (clang and
 * LLVM at work), against about 1 ms from a binary. The binary is kept in the
 * per-user cache directory (os/cache_file.c: 0700, this user's own files
 * only, never a FIFO or a link), in a file named by a hash of everything it
 * depends on: the platform, the device, its OpenCL and driver versions, the
 * kernel source and the build options. The file is a header (magic, key,
 * size) and the binary; its checksum covers the header and every byte, and
 * the size must equal the file's. A file that is short, corrupt, of another
 * key or format is ignored and rewritten from a fresh source build. Writes
 * are atomic (a temporary file and rename), so processes racing to fill the
 * cache are safe.
 *
 * A driver may crash on a bad binary rather than refuse it (PoCL asserts on
 * a truncated one), so a binary is moved aside to NAME.loading while the
 * driver reads it and put back only once it has built: one that fails to
 * build is deleted, and one that kills the process stays aside, where no
 * later process loads it (the next source build removes it).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/opencl/opencl_internal.h"
#include "os/os.h"
#include "os/status.h"
#ifdef MAPPING_OPENCL_HEADERS

enum { MAX_BINARY = 64 << 20 };
static const char MAGIC[8] = {'m', 'a', 'p', 'c', 'l', 'b', 'n', '2'}; /* 2: the checksum covers the header */
#define FNV_START 0xcbf29ce484222325ull

typedef struct cache_header {
    char     magic[8];
    uint64_t key, size, check; /* the key again, the binary's bytes, the hash of header (check 0) and binary */
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
    uint64_t h = FNV_START;
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

/* The binary of a whole cache file, when header, key, size and checksum agree. */
static const unsigned char *valid_binary(const unsigned char *file, size_t len, uint64_t key, size_t *size)
{
    cache_header h;
    if (len <= sizeof h)
        return NULL;
    memcpy(&h, file, sizeof h);
    uint64_t check = h.check;
    h.check = 0;
    if (memcmp(h.magic, MAGIC, sizeof MAGIC) || h.key != key || h.size != len - sizeof h ||
        check != mapping_os_hash64(file + sizeof h, len - sizeof h, mapping_os_hash64(&h, sizeof h, FNV_START)))
        return NULL;
    *size = len - sizeof h;
    return file + sizeof h;
}

static cl_program build_from_binary(opencl_device *d, const unsigned char *binary, size_t size, const char *options)
{
    cl_int err = CL_SUCCESS, status = CL_SUCCESS;
    cl_program program =
        mapping__opencl_driver.clCreateProgramWithBinary(d->context, 1, &d->device, &size, &binary, &status, &err);
    if (err != CL_SUCCESS || status != CL_SUCCESS) {
        if (err == CL_SUCCESS)
            mapping__opencl_driver.clReleaseProgram(program);
        return NULL;
    }
    if (mapping__opencl_driver.clBuildProgram(program, 1, &d->device, options, NULL, NULL) != CL_SUCCESS) {
        mapping__opencl_driver.clReleaseProgram(program);
        return NULL;
    }
    return program;
}

cl_program mapping__opencl_program_from_cache(opencl_device *d, const char *source, const char *options)
{
    if (!mapping__opencl_driver.clCreateProgramWithBinary || !mapping__opencl_driver.clGetProgramInfo)
        return NULL;
    uint64_t key = cache_key(d, source, options);
    char path[4200], aside[4300];
    size_t len = 0, size = 0;
    unsigned char *file;
    if (!cache_file(key, path, sizeof path) || !(file = mapping_os_read_file(path, MAX_BINARY, &len)))
        return NULL;
    cl_program program = NULL;
    const unsigned char *binary = valid_binary(file, len, key, &size);
    if (binary) {
        snprintf(aside, sizeof aside, "%s.loading", path);
        /* Another process may have moved it aside first (ENOENT): it loads
         * the same bytes, and puts them back when they build. */
        bool moved = rename(path, aside) == 0;
        program = build_from_binary(d, binary, size, options);
        if (moved && (!program || rename(aside, path) != 0))
            remove(aside);
        if (!program)
            mapping__log(1, "opencl: the driver refused the kept program binary %s: deleted, building from source", path);
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
        cache_header h = {.key = key, .size = size};
        memcpy(h.magic, MAGIC, sizeof MAGIC);
        h.check = mapping_os_hash64(binary, size, mapping_os_hash64(&h, sizeof h, FNV_START));
        memcpy(file, &h, sizeof h);
        /* No cache is not an error. A binary a crashed process left aside goes. */
        char aside[4300];
        snprintf(aside, sizeof aside, "%s.loading", path);
        if (mapping_os_write_file_atomic(path, file, sizeof h + size) == 0)
            remove(aside);
    }
    free(file);
}
#endif /* MAPPING_OPENCL_HEADERS */
