/*
 * The Jacobi step of examples/multi_device_jacobi.c on the cuda back end: the
 * kernel of jacobi.cu, shipped as PTX (jacobi_ptx.h, so no toolkit is needed),
 * loaded into each device's context and launched on the library's stream
 * through libcuda opened with dlopen (the library the back end uses). The
 * OpenCL kernel of examples/jacobi_kernel.h would be handed a CUDA context
 * on this back end, so each back end gets its own kernel.
 */
#ifndef MAPPING_EXAMPLE_JACOBI_CUDA_H
#define MAPPING_EXAMPLE_JACOBI_CUDA_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include "mapping.h"
#include "jacobi_ptx.h"

typedef struct jacobi_cu {
    void *context, *module, *function; /* CUcontext, CUmodule, CUfunction */
} jacobi_cu;

static struct {
    int (*push)(void *ctx);
    int (*pop)(void **ctx);
    int (*load)(void **module, const void *image);
    int (*get)(void **fn, void *module, const char *name);
    int (*unload)(void *module);
    int (*launch)(void *fn, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *stream,
                  void **params, void **extra);
} jacobi_cu_driver;

static int jacobi_cu_load_driver(void)
{
    if (jacobi_cu_driver.launch)
        return 1;
    const char *path = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib && !(path && *path))
        lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 0;
    *(void **)&jacobi_cu_driver.push = dlsym(lib, "cuCtxPushCurrent_v2");
    *(void **)&jacobi_cu_driver.pop = dlsym(lib, "cuCtxPopCurrent_v2");
    *(void **)&jacobi_cu_driver.load = dlsym(lib, "cuModuleLoadData");
    *(void **)&jacobi_cu_driver.get = dlsym(lib, "cuModuleGetFunction");
    *(void **)&jacobi_cu_driver.unload = dlsym(lib, "cuModuleUnload");
    void *launch = dlsym(lib, "cuLaunchKernel");
    if (!jacobi_cu_driver.push || !jacobi_cu_driver.pop || !jacobi_cu_driver.load || !jacobi_cu_driver.get ||
        !jacobi_cu_driver.unload || !launch)
        return 0;
    *(void **)&jacobi_cu_driver.launch = launch;
    return 1;
}

/* Loads the kernel into dev's context; 0 when that cannot be done. */
static int jacobi_cu_build(mapping_device *dev, jacobi_cu *k)
{
    mapping_native_device native;
    if (!jacobi_cu_load_driver() || mapping_device_native(dev, &native) != MAPPING_OK)
        return 0;
    k->context = native.context;
    void *popped;
    if (jacobi_cu_driver.push(k->context) != 0)
        return 0;
    int ok = jacobi_cu_driver.load(&k->module, jacobi_ptx) == 0; /* JIT-compiled for this GPU */
    if (ok && jacobi_cu_driver.get(&k->function, k->module, "jacobi") != 0) {
        jacobi_cu_driver.unload(k->module);
        k->module = NULL;
        ok = 0;
    }
    jacobi_cu_driver.pop(&popped);
    return ok;
}

/* Queues one step of the block on the stream. */
static int jacobi_cu_step(jacobi_cu *k, mapping_stream *stream, mapping_buffer *u, mapping_buffer *v,
                          const step_args *a)
{
    void *s, *mu, *mv, *popped;
    if (mapping_stream_native(stream, &s) || mapping_buffer_native(u, &mu) || mapping_buffer_native(v, &mv))
        return 0;
    unsigned long long pu = (uintptr_t)mu, pv = (uintptr_t)mv; /* CUdeviceptr */
    unsigned cols = (unsigned)a->cols, first = (unsigned)a->first_row, rows = (unsigned)a->rows,
             owned = (unsigned)a->owned, halo = (unsigned)a->halo;
    void *params[] = {&pu, &pv, &cols, &first, &rows, &owned, &halo};
    enum { BX = 32, BY = 8 };
    if (jacobi_cu_driver.push(k->context) != 0)
        return 0;
    int r = jacobi_cu_driver.launch(k->function, (cols + BX - 1) / BX, (owned + BY - 1) / BY, 1, BX, BY, 1, 0, s,
                                    params, NULL);
    jacobi_cu_driver.pop(&popped);
    return r == 0;
}

static void jacobi_cu_release(jacobi_cu *k)
{
    void *popped;
    if (k->module && jacobi_cu_driver.push(k->context) == 0) {
        jacobi_cu_driver.unload(k->module);
        jacobi_cu_driver.pop(&popped);
    }
    k->module = NULL;
}

#endif /* MAPPING_EXAMPLE_JACOBI_CUDA_H */
