#include <dlfcn.h>
#include <errno.h>
#include <time.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "harness.h"

typedef struct test_entry {
    const char *name;
    test_fn     fn;
    int         conformance;
} test_entry;

static test_entry tests[1024];
static int test_count;
static mapping_device *opened[2];

void test_register(const char *name, test_fn fn, int conformance)
{
    if (test_count == (int)(sizeof tests / sizeof tests[0])) {
        fprintf(stderr, "too many tests\n");
        exit(2);
    }
    tests[test_count++] = (test_entry){name, fn, conformance};
}

const char *test_backend(void)
{
    const char *b = getenv("MAPPING_BACKEND");
    return b && *b ? b : "host";
}

void test_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("SKIP: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    exit(TEST_SKIP_CODE);
}

void test_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: FAIL: ", file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static mapping_device *open_device(int slot)
{
    if (opened[slot])
        return opened[slot];
    const char *backend = test_backend();
    mapping_device_desc desc = {.backend = backend};
    mapping_status st = mapping_open(&desc, &opened[slot]);
    if (st == MAPPING_ERR_NO_BACKEND || st == MAPPING_ERR_NO_DEVICE)
        test_skip("back end %s is not available here: %s", backend, mapping_last_error_message());
    if (st != MAPPING_OK)
        test_fail(__FILE__, __LINE__, "mapping_open(%s) failed: %s", backend, mapping_last_error_message());
    return opened[slot];
}

mapping_device *test_device(void)
{
    return open_device(0);
}

mapping_device *test_device2(void)
{
    return open_device(1);
}

unsigned long long test_xorshift64(unsigned long long *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

void test_pattern(void *p, size_t n, unsigned seed)
{
    unsigned char *b = p;
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b[i] = (unsigned char)x;
    }
}

void test_gate_wait(void *arg)
{
    test_gate *g = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&g->lock);
    while (!g->open)
        if (pthread_cond_timedwait(&g->cond, &g->lock, &until) == ETIMEDOUT)
            break;
    g->passed++;
    pthread_mutex_unlock(&g->lock);
}

void test_gate_open(test_gate *g)
{
    pthread_mutex_lock(&g->lock);
    g->open = 1;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

mapping_stats test_stats(mapping_device *dev)
{
    mapping_stats s;
    CHECK_OK(mapping_device_stats(dev, &s));
    return s;
}

mapping_mirror *test_synced_mirror(mapping_device *dev, size_t n, unsigned flags, unsigned seed)
{
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, n, flags, &m));
    test_pattern(mapping_mirror_cpu(m), n, seed);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0 && mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0);
    return m;
}

void test_check_mirror_sides_equal(mapping_mirror *m)
{
    size_t n = mapping_mirror_size(m);
    unsigned char *back = malloc(n);
    CHECK(back != NULL);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), back, n));
    CHECK_BYTES(back, mapping_mirror_cpu(m), n);
    free(back);
}

int test_gate_passed(test_gate *g)
{
    pthread_mutex_lock(&g->lock);
    int passed = g->passed;
    pthread_mutex_unlock(&g->lock);
    return passed;
}

static int run(const test_entry *t)
{
    t->fn();
    for (int i = 0; i < 2; i++) {
        mapping_close(opened[i]);
        opened[i] = NULL;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < test_count; i++)
            printf("%s %s\n", tests[i].conformance ? "conformance" : "unit", tests[i].name);
        return 0;
    }
    if (argc == 2) {
        for (int i = 0; i < test_count; i++)
            if (strcmp(tests[i].name, argv[1]) == 0)
                return run(&tests[i]);
        fprintf(stderr, "no test named %s (--list lists them)\n", argv[1]);
        return 2;
    }
    fprintf(stderr, "usage: %s TEST | --list   (run them all with ctest)\n", argv[0]);
    return 2;
}

const char *test_page_perms(const void *p, char out[5])
{
    out[0] = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return out;
    char line[512], perms[5];
    unsigned long a, b;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%lx-%lx %4s", &a, &b, perms) == 3 && (uintptr_t)p >= a && (uintptr_t)p < b) {
            memcpy(out, perms, 5);
            break;
        }
    fclose(f);
    return out;
}

void *test_cuda_driver(void)
{
    const char *path = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        test_skip("cannot load the CUDA driver: %s", dlerror());
    return lib;
}

void *test_cuda_symbol(void *lib, const char *name)
{
    void *sym = dlsym(lib, name);
    if (!sym)
        test_skip("the CUDA driver has no %s", name);
    return sym;
}
