/*
 * What the tests of the fake driver itself share (cuda_fake_strict.c,
 * cuda_graph_sync.c): the fake loaded directly, no library between, and
 * its functions called by name. A function the fake does not export is a
 * failure here (the fake is ours: it must have it), where the tests of the
 * library skip a driver that lacks one (harness.h: test_cuda_symbol).
 */
#ifndef MAPPING_TEST_FAKE_DRIVER_H
#define MAPPING_TEST_FAKE_DRIVER_H

#include <dlfcn.h>
#include "harness.h"

typedef int                r_t;    /* CUresult */
typedef unsigned long long dptr_t; /* CUdeviceptr */

static void *lib; /* the fake, from dlopen */

static void *sym(const char *name)
{
    void *s = dlsym(lib, name);
    if (!s)
        test_fail(__FILE__, __LINE__, "the fake exports no %s", name);
    return s;
}
#define CU(type, name) ((type)sym(name))
#define CU_OK(call) CHECK((call) == 0)

#endif
