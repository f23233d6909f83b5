/*
 * For cuda tests: the fake driver's entry points (tests/fake/fake_libcuda.c),
 * found in the library the back end loaded, and a device opened on a chosen
 * fake profile. Header-only; tests that need the fake SKIP elsewhere.
 */
#ifndef MAPPING_TEST_FAKE_API_H
#define MAPPING_TEST_FAKE_API_H

#include <dlfcn.h>
#include <stdlib.h>
#include "harness.h"

typedef int fake_result;

/* The driver the back end loaded ($MAPPING_CUDA_LIBRARY), if it is the fake
 * (it exports fake_cuda_count); else SKIP. */
static inline void *fake_lib(void)
{
    const char *path = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = path && *path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (!lib || !dlsym(lib, "fake_cuda_count"))
        test_skip("the loaded libcuda is not tests/fake/fake_libcuda.c (its counters are needed)");
    return lib;
}

/* An entry point of the fake; FAIL when it lacks it. */
static inline void *fake_sym(const char *name)
{
    void *sym = dlsym(fake_lib(), name);
    if (!sym)
        test_fail(__FILE__, __LINE__, "the fake driver exports no %s", name);
    return sym;
}
#define FAKE_FN(type, name) ((type)fake_sym(name))

static inline long long fake_count(const char *name)
{
    return FAKE_FN(long long (*)(const char *), "fake_cuda_count")(name);
}

/* Runs before the library loads a driver (a UNIT_TEST, in its own
 * process): the back end will load the fake built as `which` (the
 * $MAPPING_TEST_FAKE_CUDA* path the test environment gives), with the
 * fake's environment `env` ("NAME=VALUE" strings, NULL-terminated, may be
 * NULL). SKIP where the fake is not built. */
static inline void fake_choose(const char *which, const char *const *env)
{
    const char *path = getenv(which);
    if (!path || !*path)
        test_skip("the fake driver is not built here (%s unset)", which);
    CHECK(setenv("MAPPING_CUDA_LIBRARY", path, 1) == 0);
    CHECK(setenv("MAPPING_BACKEND", "cuda", 1) == 0);
    for (int i = 0; env && env[i]; i++)
        CHECK(putenv((char *)(uintptr_t)env[i]) == 0);
}

/* The cuda device `index`, which must open. */
static inline mapping_device *fake_open(int index)
{
    mapping_device *dev = NULL;
    mapping_status st = mapping_open(&(mapping_device_desc){.backend = "cuda", .device = index}, &dev);
    if (st != MAPPING_OK)
        test_fail(__FILE__, __LINE__, "mapping_open(cuda %d) returned %s: %s", index, mapping_status_name(st),
                  mapping_last_error_message());
    return dev;
}

/* Driver calls of the test itself, in dev's (primary) context. */
static inline void fake_push(mapping_device *dev)
{
    mapping_native_device native;
    CHECK_OK(mapping_device_native(dev, &native));
    CHECK(FAKE_FN(fake_result (*)(void *), "cuCtxPushCurrent_v2")(native.context) == 0);
}
static inline void fake_pop(void)
{
    void *popped;
    CHECK(FAKE_FN(fake_result (*)(void **), "cuCtxPopCurrent_v2")(&popped) == 0);
}

#endif
