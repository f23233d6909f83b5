/*
 * A small test harness. Each test is a function declared with TEST (run once
 * per back end: tests/conformance/ and tests/internal/; in tests/backend/<b>/,
 * on back end <b>) or UNIT_TEST (run once: tests/unit/, tests/backend/<b>/).
 * CMake reads the names from the sources and registers each as its own CTest
 * test, which runs `mapping_tests NAME` in its own process with a timeout: a
 * crash or a hang fails one test, not the run (tests/CMakeLists.txt).
 *
 * A conformance test opens its device with test_device(); when the back end
 * named by $MAPPING_BACKEND is absent, the test prints "SKIP: <reason>" and
 * exits with 77, which CTest reports as skipped.
 */
#ifndef MAPPING_TEST_HARNESS_H
#define MAPPING_TEST_HARNESS_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mapping.h"

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn, int conformance);

#define TEST_DEFINE_(name, conformance)                                                                   \
    static void test_##name(void);                                                                        \
    __attribute__((constructor)) static void test_register_##name(void)                                   \
    {                                                                                                     \
        test_register(#name, test_##name, conformance);                                                   \
    }                                                                                                     \
    static void test_##name(void)

#define TEST(name) TEST_DEFINE_(name, 1)
#define UNIT_TEST(name) TEST_DEFINE_(name, 0)

enum { TEST_SKIP_CODE = 77 };

/* Opens device 0 of $MAPPING_BACKEND (host when unset); SKIP when absent.
 * The harness closes it after the test: do not close it yourself. */
mapping_device *test_device(void);
/* Another, independent device object of the same back end. */
mapping_device *test_device2(void);
/* The test's back end name. */
const char *test_backend(void);
/* The permissions ("rw-p", ...) /proc/self/maps gives the page at p, or
 * "" where it is not mapped; returns out. */
const char *test_page_perms(const void *p, char out[5]);
/* TEST_TSAN, TEST_ASAN: 1 when the tests are built under ThreadSanitizer /
 * AddressSanitizer (gcc says so with __SANITIZE_*__, clang with
 * __has_feature), else 0. */
#if defined(__SANITIZE_THREAD__)
#define TEST_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#endif
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) && !defined(TEST_TSAN)
#define TEST_TSAN 1
#endif
#if __has_feature(address_sanitizer) && !defined(TEST_ASAN)
#define TEST_ASAN 1
#endif
#endif
#ifndef TEST_TSAN
#define TEST_TSAN 0
#endif
#ifndef TEST_ASAN
#define TEST_ASAN 0
#endif

/* The CUDA driver the cuda back end loads ($MAPPING_CUDA_LIBRARY, else
 * libcuda.so.1), for tests that call it beside the library; SKIP when it
 * cannot be loaded. */
void *test_cuda_driver(void);
/* Function `name` of that driver; SKIP naming it when the driver lacks it. */
void *test_cuda_symbol(void *lib, const char *name);
/* table.name = the driver's `name` (a struct of function pointers named as
 * the driver's functions). */
#define TEST_CU_LOAD(table, lib, name)                         \
    do {                                                       \
        void *test_sym_ = test_cuda_symbol((lib), #name);      \
        memcpy(&(table).name, &test_sym_, sizeof test_sym_);   \
    } while (0)
/* Prints SKIP with the reason and exits 77. */
void test_skip(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
/* Fails the test. */
void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond))                                                                \
            test_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond);               \
    } while (0)

#define CHECK_STATUS(expr, expected)                                                                          \
    do {                                                                                                      \
        mapping_status st_ = (expr);                                                                          \
        mapping_status ex_ = (expected);                                                                      \
        if (st_ != ex_)                                                                                       \
            test_fail(__FILE__, __LINE__, "%s returned %s (%d), expected %s (%d); last error: %s", #expr,    \
                      mapping_status_name(st_), (int)st_, mapping_status_name(ex_), (int)ex_,                 \
                      mapping_last_error_message());                                                          \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, MAPPING_OK)

#define CHECK_BYTES(actual, expected, n)                                                                       \
    do {                                                                                                       \
        const unsigned char *a_ = (const unsigned char *)(actual), *e_ = (const unsigned char *)(expected); \
        size_t n_ = (n);                                                                                       \
        for (size_t i_ = 0; i_ < n_; i_++)                                                                     \
            if (a_[i_] != e_[i_])                                                                              \
                test_fail(__FILE__, __LINE__, "byte %zu of %zu differs: got 0x%02x, expected 0x%02x", i_, n_,  \
                          a_[i_], e_[i_]);                                                                     \
    } while (0)

/* The bad-input check: expr returns `expected`, which also becomes the
 * thread's last error, with a message. */
#define CHECK_REFUSED(expr, expected)                                                                   \
    do {                                                                                                \
        mapping_clear_last_error();                                                                     \
        CHECK_STATUS(expr, expected);                                                                   \
        CHECK(mapping_last_error() == (expected));                                                      \
        CHECK(mapping_last_error_message()[0] != '\0');                                                 \
    } while (0)

/* The device's statistics now (mapping_device_stats, checked). */
mapping_stats test_stats(mapping_device *dev);
/* A mirror of n bytes (mapping_mirror_create flags) whose both sides hold
 * test_pattern(seed) and are valid. */
mapping_mirror *test_synced_mirror(mapping_device *dev, size_t n, unsigned flags, unsigned seed);
/* Checks that the mirror's device side holds what its CPU side holds. */
void test_check_mirror_sides_equal(mapping_mirror *m);

/* A gate holds a stream: mapping_launch_host(s, test_gate_wait, &gate)
 * blocks the stream's later work until test_gate_open(&gate). The wait is
 * bounded (10 s), so a back end that ran the function inline fails the
 * test's checks instead of hanging it. */
typedef struct test_gate {
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    int             open;
    int             passed; /* how many waits have passed the gate */
} test_gate;
#define TEST_GATE_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0}
void test_gate_wait(void *gate);
void test_gate_open(test_gate *gate);
int  test_gate_passed(test_gate *gate);

/* Fills p with a pattern that depends on seed and position. */
void test_pattern(void *p, size_t n, unsigned seed);
/* The next value of a xorshift64 generator (state: any non-zero seed): the
 * model tests' random choices, reproducible from their printed seed. */
unsigned long long test_xorshift64(unsigned long long *state);

#endif
