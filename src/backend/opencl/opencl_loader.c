/*
 * Loading the OpenCL ICD loader at run time (in the manner of the Khronos ICD
 * loader and cuew): a short list of names, an environment override, every
 * entry point resolved and checked, once per process.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "backend/opencl/opencl_api.h"
#include "os/os.h"
#ifdef MAPPING_OPENCL_HEADERS

opencl_api mapping__opencl_driver;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static mapping_status load_status;
static char load_why[256];

static void load_library(void)
{
    static const char *const names[] = {"libOpenCL.so.1", "libOpenCL.so", NULL};
    void *lib = mapping_os_dlopen_first("MAPPING_OPENCL_LIBRARY", names, load_why, sizeof load_why);
    if (!lib) {
        load_status = MAPPING_ERR_NO_BACKEND;
        return;
    }
    opencl_api api;
    memset(&api, 0, sizeof api);
    /* A void * from dlsym goes into a function pointer through memcpy: ISO C
     * has no conversion between the two, POSIX guarantees they share a form. */
#define OPENCL_RESOLVE_REQUIRED_(name)                                                                          \
    {                                                                                                        \
        void *sym = mapping_os_dlsym(lib, #name);                                                            \
        if (!sym) {                                                                                          \
            snprintf(load_why, sizeof load_why, "the OpenCL library has no entry point %s (OpenCL 1.2 needed)", \
                     #name);                                                                                 \
            load_status = MAPPING_ERR_NO_BACKEND;                                                            \
            return; /* the handle stays open: dlclose of a half-used ICD loader buys nothing */              \
        }                                                                                                    \
        memcpy(&api.name, &sym, sizeof sym);                                                                 \
    }
    OPENCL_REQUIRED_ENTRY_POINTS(OPENCL_RESOLVE_REQUIRED_)
#undef OPENCL_RESOLVE_REQUIRED_
#define OPENCL_RESOLVE_OPTIONAL_(name)                                                                          \
    {                                                                                                        \
        void *sym = mapping_os_dlsym(lib, #name);                                                            \
        if (sym)                                                                                             \
            memcpy(&api.name, &sym, sizeof sym);                                                             \
    }
    OPENCL_OPTIONAL_ENTRY_POINTS(OPENCL_RESOLVE_OPTIONAL_)
#undef OPENCL_RESOLVE_OPTIONAL_
    mapping__opencl_driver = api;
    load_status = MAPPING_OK;
}

mapping_status mapping__opencl_api_load(char *why, size_t why_size)
{
    pthread_once(&load_once, load_library);
    if (load_status != MAPPING_OK && why)
        snprintf(why, why_size, "%s", load_why);
    return load_status;
}
#endif /* MAPPING_OPENCL_HEADERS */
