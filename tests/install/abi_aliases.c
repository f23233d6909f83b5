/*
 * Deprecated names stay in the ABI: a program built against them still
 * finds them in libmapping.so (the batch adds' and the native getters'
 * old names, beside the new ones). Loads the library given as argv[1] with
 * dlopen, finds the old and new names with dlsym, and calls the old ones
 * (with a NULL batch: refused, and the message names the old function).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "mapping.h"

typedef mapping_status (*to_gpu_fn)(mapping_batch *, const void *, mapping_buffer *, size_t, size_t);
typedef mapping_status (*to_cpu_fn)(mapping_batch *, const mapping_buffer *, size_t, void *, size_t);
typedef const char *(*message_fn)(void);

static int failures;

static void *need(void *lib, const char *name)
{
    void *sym = dlsym(lib, name);
    if (!sym) {
        printf("FAIL: %s is not exported (%s)\n", name, dlerror());
        failures++;
    }
    return sym;
}

static void expect_refused(mapping_status status, message_fn message, const char *name)
{
    const char *msg = message();
    if (status != MAPPING_ERR_NULL_ARGUMENT || strncmp(msg, name, strlen(name)) != 0) {
        printf("FAIL: %s(NULL batch) returned %d, \"%s\"\n", name, (int)status, msg);
        failures++;
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s path/to/libmapping.so\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("FAIL: dlopen: %s\n", dlerror());
        return 1;
    }
    need(lib, "mapping_batch_add_to_gpu");
    need(lib, "mapping_batch_add_to_cpu");
    need(lib, "mapping_mirror_needs_sync");
    need(lib, "mapping_device_native"); /* and the native getters' old names */
    need(lib, "mapping_buffer_native");
    need(lib, "mapping_stream_native");
    need(lib, "mapping_native_device_handles");
    need(lib, "mapping_native_buffer");
    need(lib, "mapping_native_stream");
    to_gpu_fn old_gpu;
    to_cpu_fn old_cpu;
    message_fn message;
    *(void **)&old_gpu = need(lib, "mapping_batch_sync_to_gpu");
    *(void **)&old_cpu = need(lib, "mapping_batch_sync_to_cpu");
    *(void **)&message = need(lib, "mapping_last_error_message");
    if (old_gpu && old_cpu && message) {
        unsigned char host[16];
        expect_refused(old_gpu(NULL, host, NULL, 0, sizeof host), message, "mapping_batch_sync_to_gpu");
        expect_refused(old_cpu(NULL, NULL, 0, host, sizeof host), message, "mapping_batch_sync_to_cpu");
    }
    dlclose(lib);
    if (!failures)
        printf("the deprecated names are exported beside the new ones, and work\n");
    return failures != 0;
}
