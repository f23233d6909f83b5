/*
 * The copy threads (src/os/copy_pool.c) do not outlive libmapping.so: a
 * program that dlopens the library, makes large staged copies of pageable
 * memory (cuda on the fake driver, MAPPING_COPY_THREADS=2: the helpers are
 * made), closes the device and dlcloses the library has the helpers joined
 * by the library's destructor; left running, their code would be unmapped
 * under them. Arguments: the library, then the fake libcuda.
 * Exit 0 passed, 1 failed, 77 skipped (no /proc/self/task).
 */
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "mapping.h"

static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

typedef mapping_status (*open_fn)(const mapping_device_desc *, mapping_device **);
typedef void (*close_fn)(mapping_device *);
typedef mapping_status (*allocate_fn)(mapping_device *, size_t, mapping_buffer **);
typedef void (*free_fn)(mapping_buffer *);
typedef mapping_status (*to_gpu_fn)(mapping_stream *, const void *, mapping_buffer *, size_t, size_t);
typedef mapping_status (*to_cpu_fn)(mapping_stream *, const mapping_buffer *, size_t, void *, size_t);
typedef const char *(*message_fn)(void);

/* dlsym into a function pointer (through memcpy: ISO C has no cast from
 * void * to a function pointer). */
#define NEED(lib, name, type)                                                                                   \
    type name##_p;                                                                                             \
    do {                                                                                                       \
        void *sym_ = dlsym(lib, #name);                                                                        \
        if (!sym_) {                                                                                           \
            printf("FAIL: dlsym %s\n", #name);                                                                 \
            return 1;                                                                                          \
        }                                                                                                      \
        memcpy(&name##_p, &sym_, sizeof sym_);                                                                 \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s path/to/libmapping.so path/to/fake_libcuda.so\n", argv[0]);
        return 2;
    }
    if (thread_count() < 0) {
        printf("SKIP: no /proc/self/task to count threads in\n");
        return 77;
    }
    setenv("MAPPING_BACKEND", "cuda", 1);
    setenv("MAPPING_CUDA_LIBRARY", argv[2], 1);
    setenv("MAPPING_COPY_THREADS", "2", 1);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("FAIL: dlopen: %s\n", dlerror());
        return 1;
    }
    NEED(lib, mapping_open, open_fn);
    NEED(lib, mapping_close, close_fn);
    NEED(lib, mapping_allocate_gpu, allocate_fn);
    NEED(lib, mapping_free_gpu, free_fn);
    NEED(lib, mapping_sync_to_gpu_range, to_gpu_fn);
    NEED(lib, mapping_sync_to_cpu_range, to_cpu_fn);
    NEED(lib, mapping_last_error_message, message_fn);

    const size_t bytes = (size_t)16 << 20;
    unsigned char *src = malloc(bytes), *back = malloc(bytes);
    if (!src || !back)
        return 1;
    for (size_t i = 0; i < bytes; i++)
        src[i] = (unsigned char)(i * 7 + (i >> 13));
    memset(back, 0, bytes);
    mapping_device *dev = NULL;
    mapping_buffer *buf = NULL;
    if (mapping_open_p(NULL, &dev) != MAPPING_OK || mapping_allocate_gpu_p(dev, bytes, &buf) != MAPPING_OK) {
        printf("FAIL: open or allocate on the fake driver: %s\n", mapping_last_error_message_p());
        return 1;
    }
    int before = thread_count();
    if (mapping_sync_to_gpu_range_p(NULL, src, buf, 0, bytes) != MAPPING_OK ||
        mapping_sync_to_cpu_range_p(NULL, buf, 0, back, bytes) != MAPPING_OK || memcmp(src, back, bytes) != 0) {
        printf("FAIL: a blocking 16 MiB copy there and back: %s\n", mapping_last_error_message_p());
        return 1;
    }
    int with_helpers = thread_count();
    mapping_free_gpu_p(buf);
    mapping_close_p(dev);
    int closed = thread_count();
    if (dlclose(lib) != 0) {
        printf("FAIL: dlclose: %s\n", dlerror());
        return 1;
    }
    int unloaded = thread_count();
    printf("threads: %d before the copies, %d after them, %d after mapping_close, %d after dlclose\n", before,
           with_helpers, closed, unloaded);
    if (dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD)) {
        printf("SKIP: the library stayed loaded after dlclose (something else holds it)\n");
        return 77;
    }
    if (with_helpers < before + 2) {
        printf("FAIL: the copies made no helper threads (MAPPING_COPY_THREADS=2)\n");
        return 1;
    }
    if (unloaded > closed - 2) {
        printf("FAIL: the helper threads outlived the library\n");
        return 1;
    }
    usleep(50000); /* a helper left behind would crash here, its code unmapped */
    free(src);
    free(back);
    printf("the helpers were joined when the library was unloaded\n");
    return 0;
}
