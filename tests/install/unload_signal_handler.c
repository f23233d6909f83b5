/*
 * The library's SIGSEGV handler (mprotect write tracking, installed at the
 * first tracked mirror) outlives a dlclose of libmapping.so: the library
 * stays loaded (RTLD_NODELETE), so a crash after the dlclose still reaches
 * the program's own handler through it. Unloaded, the handler would point
 * at unmapped code and the process would die without the program's handler
 * running. Argument: the library. Exit 0 passed, 1 failed, 77 skipped
 * (no write tracking by mprotect here).
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "mapping.h"

static void program_handler(int sig)
{
    (void)sig;
    static const char ok[] = "the program's handler caught the crash\n";
    ssize_t w = write(2, ok, sizeof ok - 1);
    (void)w;
    _exit(0);
}

typedef mapping_status (*open_fn)(const mapping_device_desc *, mapping_device **);
typedef void (*close_fn)(mapping_device *);
typedef mapping_status (*create_fn)(mapping_device *, size_t, unsigned, mapping_mirror **);
typedef void (*destroy_fn)(mapping_mirror *);
typedef void *(*cpu_fn)(const mapping_mirror *);

int main(int argc, char **argv)
{
    if (argc < 2)
        return 1;
    setenv("MAPPING_TRACK", "mprotect", 1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = program_handler;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, NULL) != 0)
        return 1;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    open_fn open = (open_fn)dlsym(lib, "mapping_open");
    close_fn close_dev = (close_fn)dlsym(lib, "mapping_close");
    create_fn create = (create_fn)dlsym(lib, "mapping_mirror_create");
    destroy_fn destroy = (destroy_fn)dlsym(lib, "mapping_mirror_destroy");
    cpu_fn cpu = (cpu_fn)dlsym(lib, "mapping_mirror_cpu");
    if (!open || !close_dev || !create || !destroy || !cpu)
        return 1;
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    mapping_mirror *m;
    if (open(&desc, &dev) != MAPPING_OK)
        return 1;
    if (create(dev, 1 << 16, MAPPING_MIRROR_TRACK_WRITES, &m) != MAPPING_OK) {
        fprintf(stderr, "SKIP: no write tracking by mprotect here\n");
        return 77;
    }
    ((unsigned char *)cpu(m))[5] = 1; /* the library's fault: its handler is installed */
    destroy(m);
    close_dev(dev);
    dlclose(lib);
    volatile unsigned char *closed = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (closed == MAP_FAILED)
        return 1;
    closed[0] = 1; /* a genuine crash: the program's handler exits 0 */
    fprintf(stderr, "FAIL: the write to a PROT_NONE page did not fault\n");
    return 1;
}
