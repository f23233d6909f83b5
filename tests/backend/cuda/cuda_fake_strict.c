/*
 * The fake driver itself (tests/fake/fake_libcuda.c) refuses what a real
 * driver refuses: a negative test for each point of issue 38's list, and of
 * stream capture. Each UNIT_TEST loads the fake directly (no library) in its
 * own process, so its environment (FAKE_LIBCUDA_*) is read at load.
 */
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include "backend/cuda/cuda_kernels_ptx.h"
#include "fake_driver.h"

enum {
    INVALID_VALUE = 1, INVALID_PTX = 218, UNSUPPORTED_PTX_VERSION = 222, OPERATING_SYSTEM = 304,
    INVALID_HANDLE = 400, NOT_READY = 600, CAPTURE_UNSUPPORTED = 900, CAPTURE_INVALIDATED = 901,
    CAPTURE_ISOLATION = 905, CAPTURE_IMPLICIT = 906,
};

/* Loads the fake built as `which` with the environment `env` (NULL-ended),
 * initialises it and makes device `device`'s primary context current. */
static void *load(const char *which, const char *const *env, int device)
{
    const char *path = getenv(which);
    if (!path || !*path)
        test_skip("the fake driver is not built here (%s unset)", which);
    for (int i = 0; env && env[i]; i++)
        CHECK(putenv((char *)(uintptr_t)env[i]) == 0);
    CHECK((lib = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL);
    void *ctx = NULL;
    CU_OK(CU(r_t (*)(unsigned), "cuInit")(0));
    CU_OK(CU(r_t (*)(void **, int), "cuDevicePrimaryCtxRetain")(&ctx, device));
    CU_OK(CU(r_t (*)(void *), "cuCtxPushCurrent_v2")(ctx));
    return ctx;
}

static void *stream_new(unsigned flags)
{
    void *s = NULL;
    CU_OK(CU(r_t (*)(void **, unsigned), "cuStreamCreate")(&s, flags));
    return s;
}

static dptr_t dev_alloc(size_t n)
{
    dptr_t p = 0;
    CU_OK(CU(r_t (*)(dptr_t *, size_t), "cuMemAlloc_v2")(&p, n));
    return p;
}

static r_t load_ptx(const char *ptx, char *log, size_t cap, void **module)
{
    int options[] = {5, 6}; /* CU_JIT_ERROR_LOG_BUFFER, _SIZE_BYTES */
    void *values[] = {log, (void *)(uintptr_t)cap};
    log[0] = '\0';
    return CU(r_t (*)(void **, const void *, unsigned, int *, void **), "cuModuleLoadDataEx")(module, ptx, 2, options,
                                                                                               values);
}

UNIT_TEST(fake_cuda_jit_refuses_ptx_a_driver_cannot_read)
{
    load("MAPPING_TEST_FAKE_CUDA", NULL, 0);
    char log[512];
    void *module = NULL;
    CHECK(load_ptx(".version 99.9\n.target sm_75\n.entry mapping_copy_entries(", log, sizeof log, &module) ==
          UNSUPPORTED_PTX_VERSION);
    CHECK(strstr(log, "Unsupported .version 99.9") != NULL);
    CHECK(load_ptx("not PTX at all", log, sizeof log, &module) == INVALID_PTX);
    CHECK(load_ptx(".version 6.3\n.target sm_90\n.entry mapping_copy_entries(", log, sizeof log, &module) ==
          INVALID_PTX);
    CHECK(strstr(log, "sm_90") != NULL);
    CU_OK(load_ptx(cuda_kernels_ptx, log, sizeof log, &module));
}

typedef r_t (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);

UNIT_TEST(fake_cuda_launches_are_checked_against_the_device_limits)
{
    load("MAPPING_TEST_FAKE_CUDA", NULL, 0);
    char log[512];
    void *module = NULL, *fn = NULL;
    CU_OK(load_ptx(cuda_kernels_ptx, log, sizeof log, &module));
    CU_OK(CU(r_t (*)(void **, void *, const char *), "cuModuleGetFunction")(&fn, module, "mapping_copy_entries"));
    dptr_t mem = dev_alloc(4096);
    unsigned long long count = 0, split = 16384;
    unsigned gather = 0;
    void *params[] = {&mem, &mem, &count, &mem, &gather, &split};
    launch_fn launch = CU(launch_fn, "cuLaunchKernel");
    CHECK(launch(fn, 1, 1, 1, 2048, 1, 1, 0, NULL, params, NULL) == INVALID_VALUE);      /* 2048 threads */
    CHECK(launch(fn, 1, 1, 1, 256, 1, 1, 64 << 10, NULL, params, NULL) == INVALID_VALUE); /* 64 KiB shared */
    CHECK(launch(fn, 1, 70000, 1, 256, 1, 1, 0, NULL, params, NULL) == INVALID_VALUE);   /* grid y > 65535 */
    CHECK(launch(fn, 0, 1, 1, 256, 1, 1, 0, NULL, params, NULL) == INVALID_VALUE);       /* an empty grid */
    CU_OK(launch(fn, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CU_OK(CU(r_t (*)(void *), "cuStreamSynchronize")(NULL));
}

UNIT_TEST(fake_cuda_refuses_unknown_flags_and_read_only_registrations)
{
    load("MAPPING_TEST_FAKE_CUDA", NULL, 0);
    void *e = NULL, *s = NULL, *h = NULL;
    typedef r_t (*create_fn)(void **, unsigned);
    CHECK(CU(create_fn, "cuEventCreate")(&e, 0x10) == INVALID_VALUE);
    CHECK(CU(create_fn, "cuEventCreate")(&e, 4) == INVALID_VALUE); /* INTERPROCESS without DISABLE_TIMING */
    CHECK(CU(create_fn, "cuStreamCreate")(&s, 2) == INVALID_VALUE);
    CHECK(CU(r_t (*)(void **, size_t, unsigned), "cuMemHostAlloc")(&h, 4096, 8) == INVALID_VALUE);
    typedef r_t (*register_fn)(void *, size_t, unsigned);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *rw = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *ro = mmap(NULL, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(rw != MAP_FAILED && ro != MAP_FAILED);
    CHECK(CU(register_fn, "cuMemHostRegister_v2")(rw, page, 0x10) == INVALID_VALUE);
    CHECK(CU(register_fn, "cuMemHostRegister_v2")(ro, page, 1) == INVALID_VALUE); /* read-only, registered writable */
    CU_OK(CU(register_fn, "cuMemHostRegister_v2")(ro, page, 1 | 8));                /* CU_MEMHOSTREGISTER_READ_ONLY */
    CU_OK(CU(r_t (*)(void *), "cuMemHostUnregister")(ro));
    /* An untimed event cannot be timed. */
    void *a = NULL, *b = NULL;
    float ms;
    CU_OK(CU(create_fn, "cuEventCreate")(&a, 2));
    CU_OK(CU(create_fn, "cuEventCreate")(&b, 2));
    CU_OK(CU(r_t (*)(void *, void *), "cuEventRecord")(a, NULL));
    CU_OK(CU(r_t (*)(void *, void *), "cuEventRecord")(b, NULL));
    CU_OK(CU(r_t (*)(void *), "cuEventSynchronize")(b));
    CHECK(CU(r_t (*)(float *, void *, void *), "cuEventElapsedTime")(&ms, a, b) == INVALID_HANDLE);
    CU_OK(CU(r_t (*)(void *), "cuEventDestroy_v2")(a));
    CU_OK(CU(r_t (*)(void *), "cuEventDestroy_v2")(b));
    munmap(rw, page);
    munmap(ro, page);
}

static r_t query_after(void *stream)
{
    void *e = NULL;
    CU_OK(CU(r_t (*)(void **, unsigned), "cuEventCreate")(&e, 2));
    CU_OK(CU(r_t (*)(void *, void *), "cuEventRecord")(e, stream));
    usleep(20000);
    r_t r = CU(r_t (*)(void *), "cuEventQuery")(e);
    CU_OK(CU(r_t (*)(void *), "cuEventDestroy_v2")(e));
    return r;
}

/* Streams made without CU_STREAM_NON_BLOCKING wait for the legacy stream,
 * and it for them; non-blocking streams do not. */
UNIT_TEST(fake_cuda_legacy_stream_synchronizes_with_blocking_streams)
{
    load("MAPPING_TEST_FAKE_CUDA", NULL, 0);
    void (*hold)(int) = CU(void (*)(int), "fake_cuda_hold_legacy");
    void *blocking = stream_new(0), *nonblocking = stream_new(1);
    dptr_t mem = dev_alloc(4096);
    hold(1);
    CU_OK(CU(r_t (*)(dptr_t, unsigned char, size_t, void *), "cuMemsetD8Async")(mem, 1, 4096, NULL));
    CHECK(query_after(blocking) == NOT_READY);
    CU_OK(query_after(nonblocking));
    hold(0);
    CU_OK(CU(r_t (*)(void *), "cuStreamSynchronize")(blocking));
    /* The other way: the legacy stream waits for a held blocking stream. */
    test_gate gate = TEST_GATE_INIT;
    CU_OK(CU(r_t (*)(void *, void (*)(void *), void *), "cuLaunchHostFunc")(blocking, test_gate_wait, &gate));
    CHECK(query_after(NULL) == NOT_READY);
    test_gate_open(&gate);
    CU_OK(CU(r_t (*)(void *), "cuStreamSynchronize")(NULL));
}

/* A copy past its allocation is refused at the call, and nothing sticks.
 * The ranges cross the allocation's end (not start past it: the next
 * allocation may begin right there, and a driver accepts that address). */
UNIT_TEST(fake_cuda_refuses_bad_copy_ranges_at_the_call)
{
    load("MAPPING_TEST_FAKE_CUDA", NULL, 0);
    dptr_t a = dev_alloc(4096), b = dev_alloc(4096);
    void *s = stream_new(1);
    typedef r_t (*dtod_fn)(dptr_t, dptr_t, size_t, void *);
    CHECK(CU(dtod_fn, "cuMemcpyDtoDAsync_v2")(b, a + 4000, 200, s) == INVALID_VALUE);
    CHECK(CU(r_t (*)(dptr_t, unsigned char, size_t, void *), "cuMemsetD8Async")(a + 4000, 0, 200, s) == INVALID_VALUE);
    CU_OK(CU(r_t (*)(void *), "cuStreamSynchronize")(s));
    CU_OK(CU(dtod_fn, "cuMemcpyDtoDAsync_v2")(b, a, 4096, s));
    CU_OK(CU(r_t (*)(void *), "cuStreamSynchronize")(s));
}

/* FAKE_LIBCUDA_DEVICES=2: a second device, with a context of its own (its
 * memory, its sticky error). */
UNIT_TEST(fake_cuda_second_device_has_a_context_of_its_own)
{
    static const char *const env[] = {"FAKE_LIBCUDA_DEVICES=2", NULL};
    void *ctx0 = load("MAPPING_TEST_FAKE_CUDA", env, 0), *ctx1 = NULL, *popped, *owner = NULL;
    int n = 0, ordinal = -1;
    CU_OK(CU(r_t (*)(int *), "cuDeviceGetCount")(&n));
    CHECK(n == 2);
    CU_OK(CU(r_t (*)(void **, int), "cuDevicePrimaryCtxRetain")(&ctx1, 1));
    CHECK(ctx1 != ctx0);
    CU_OK(CU(r_t (*)(void *), "cuCtxPushCurrent_v2")(ctx1));
    dptr_t m1 = dev_alloc(4096);
    typedef r_t (*attr_fn)(void *, int, dptr_t);
    CU_OK(CU(attr_fn, "cuPointerGetAttribute")(&ordinal, 9, m1));
    CU_OK(CU(attr_fn, "cuPointerGetAttribute")(&owner, 1, m1));
    CHECK(ordinal == 1 && owner == ctx1);
    /* An illegal address in device 1's context sticks there only. */
    char log[512];
    void *module = NULL, *fn = NULL;
    CU_OK(load_ptx(cuda_kernels_ptx, log, sizeof log, &module));
    CU_OK(CU(r_t (*)(void **, void *, const char *), "cuModuleGetFunction")(&fn, module, "mapping_copy_entries"));
    dptr_t bad = 64;
    unsigned long long count = 1, split = 16384;
    unsigned gather = 0;
    void *params[] = {&m1, &bad, &count, &m1, &gather, &split};
    CU_OK(CU(launch_fn, "cuLaunchKernel")(fn, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CHECK(CU(r_t (*)(void *), "cuStreamSynchronize")(NULL) == 700);
    CU_OK(CU(r_t (*)(void **), "cuCtxPopCurrent_v2")(&popped));
    CU_OK(CU(r_t (*)(void *), "cuStreamSynchronize")(NULL)); /* device 0 goes on */
    dev_alloc(4096);
}

/* A CUDA 12.2 driver: no cuFuncLoad, no batch copy; a function loads at its
 * first launch, which waits for every stream. */
UNIT_TEST(fake_cuda_12_2_profile_loads_functions_at_their_first_launch)
{
    load("MAPPING_TEST_FAKE_CUDA_12_2", NULL, 0);
    CHECK(dlsym(lib, "cuFuncLoad") == NULL && dlsym(lib, "cuMemcpyBatchAsync") == NULL);
    char log[512];
    void *module = NULL, *fn = NULL;
    CU_OK(load_ptx(cuda_kernels_ptx, log, sizeof log, &module));
    CU_OK(CU(r_t (*)(void **, void *, const char *), "cuModuleGetFunction")(&fn, module, "mapping_copy_entries"));
    dptr_t mem = dev_alloc(4096);
    unsigned long long count = 0, split = 16384;
    unsigned gather = 0;
    void *params[] = {&mem, &mem, &count, &mem, &gather, &split};
    long long (*counter)(const char *) = CU(long long (*)(const char *), "fake_cuda_count");
    long long before = counter("lazy_loads");
    CU_OK(CU(launch_fn, "cuLaunchKernel")(fn, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CU_OK(CU(launch_fn, "cuLaunchKernel")(fn, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CHECK(counter("lazy_loads") == before + 1);
}

static int open_descriptors(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

/* The driver holds descriptors from cuInit, and an allocation needs one
 * more for a moment: at the limit it fails (CUDA_ERROR_OPERATING_SYSTEM). */
UNIT_TEST(fake_cuda_holds_descriptors_as_a_driver_does)
{
    int before = open_descriptors();
    load("MAPPING_TEST_FAKE_CUDA", NULL, 0);
    CHECK(open_descriptors() >= before + 60);
    struct rlimit old, tight;
    CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0);
    tight = old;
    tight.rlim_cur = 0;
    for (int fd = 0; fd < 4096; fd++) /* the lowest limit that the open descriptors allow */
        if (fcntl(fd, F_GETFD) != -1)
            tight.rlim_cur = (rlim_t)fd + 1;
    CHECK(setrlimit(RLIMIT_NOFILE, &tight) == 0);
    int fillers[256], filled = 0; /* the gaps below the limit, taken */
    for (int fd; filled < 256 && (fd = open("/dev/null", O_RDONLY)) >= 0;)
        fillers[filled++] = fd;
    dptr_t p = 0;
    r_t r = CU(r_t (*)(dptr_t *, size_t), "cuMemAlloc_v2")(&p, 4096);
    while (filled > 0)
        close(fillers[--filled]);
    CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
    CHECK(r == OPERATING_SYSTEM);
    dev_alloc(4096);
}

/* ---- stream capture ---- */

typedef r_t (*stream_fn)(void *);
typedef r_t (*begin_fn)(void *, int);
typedef r_t (*end_fn)(void *, void **);

static r_t end_capture(void *s)
{
    void *graph = NULL;
    r_t r = CU(end_fn, "cuStreamEndCapture")(s, &graph);
    if (graph)
        CU_OK(CU(r_t (*)(void *), "cuGraphDestroy")(graph));
    return r;
}

/* What a capture forbids fails and invalidates it, as on a GPU. */
UNIT_TEST(fake_cuda_capture_refuses_what_a_driver_refuses)
{
    load("MAPPING_TEST_FAKE_CUDA", NULL, 0);
    void *s = stream_new(1), *other = stream_new(1), *blocking = stream_new(0), *e = NULL;
    dptr_t mem = dev_alloc(4096);
    unsigned char pageable[64];
    int status = -1;
    begin_fn begin = CU(begin_fn, "cuStreamBeginCapture_v2");
    CU_OK(CU(r_t (*)(void **, unsigned), "cuEventCreate")(&e, 0));
    CHECK(begin(NULL, 0) == CAPTURE_UNSUPPORTED); /* the legacy stream cannot be captured */

    CU_OK(begin(s, 0));
    CHECK(CU(stream_fn, "cuStreamSynchronize")(s) == CAPTURE_UNSUPPORTED);
    CHECK(end_capture(s) == CAPTURE_INVALIDATED);

    CU_OK(begin(s, 0));
    CU_OK(CU(r_t (*)(void *, void *), "cuEventRecord")(e, s));
    CHECK(CU(stream_fn, "cuEventQuery")(e) == CAPTURE_UNSUPPORTED);
    CHECK(end_capture(s) == CAPTURE_INVALIDATED);

    CU_OK(begin(s, 0));
    CHECK(CU(r_t (*)(dptr_t, const void *, size_t, void *), "cuMemcpyHtoDAsync_v2")(mem, pageable, 64, s) ==
          CAPTURE_UNSUPPORTED);
    CHECK(end_capture(s) == CAPTURE_INVALIDATED);

    CU_OK(CU(r_t (*)(void *, void *), "cuEventRecord")(e, other)); /* outside the capture */
    CU_OK(begin(s, 0));
    CHECK(CU(r_t (*)(void *, void *, unsigned), "cuStreamWaitEvent")(s, e, 0) == CAPTURE_ISOLATION);
    CHECK(end_capture(s) == CAPTURE_INVALIDATED);

    /* The legacy stream while a blocking stream captures: asking is fine,
     * using it is not. */
    CU_OK(begin(blocking, 0));
    CHECK(CU(r_t (*)(void *, int *), "cuStreamIsCapturing")(NULL, &status) == CAPTURE_IMPLICIT);
    CU_OK(CU(r_t (*)(void *, int *), "cuStreamIsCapturing")(blocking, &status));
    CHECK(status == 1);
    CHECK(CU(r_t (*)(dptr_t, unsigned char, size_t), "cuMemsetD8_v2")(mem, 0, 64) == CAPTURE_IMPLICIT);
    CHECK(end_capture(blocking) == CAPTURE_INVALIDATED);
    CU_OK(CU(stream_fn, "cuEventDestroy_v2")(e));
}

typedef struct other_thread {
    void *ctx;
    int   mode; /* the thread's capture mode for its call */
    r_t   result;
} other_thread;

static void *allocate_there(void *arg)
{
    other_thread *t = arg;
    void *popped;
    dptr_t p = 0;
    int mode = t->mode;
    CU_OK(CU(r_t (*)(void *), "cuCtxPushCurrent_v2")(t->ctx));
    CU_OK(CU(r_t (*)(int *), "cuThreadExchangeStreamCaptureMode")(&mode));
    t->result = CU(r_t (*)(dptr_t *, size_t), "cuMemAlloc_v2")(&p, 4096);
    CU_OK(CU(r_t (*)(void **), "cuCtxPopCurrent_v2")(&popped));
    return NULL;
}

/* A capture in the global mode is invalidated by another thread's unsafe
 * call, unless that thread is in the relaxed mode. */
UNIT_TEST(fake_cuda_global_capture_is_broken_by_other_threads_unless_relaxed)
{
    void *ctx = load("MAPPING_TEST_FAKE_CUDA", NULL, 0);
    void *s = stream_new(1);
    for (int mode = 0; mode <= 2; mode += 2) {
        CU_OK(CU(begin_fn, "cuStreamBeginCapture_v2")(s, 0));
        other_thread t = {ctx, mode, -1};
        pthread_t th;
        CHECK(pthread_create(&th, NULL, allocate_there, &t) == 0);
        CHECK(pthread_join(th, NULL) == 0);
        CHECK(t.result == (mode == 2 ? 0 : CAPTURE_UNSUPPORTED));
        CHECK(end_capture(s) == (mode == 2 ? 0 : CAPTURE_INVALIDATED));
    }
}

/* A graph runs its nodes in order at each launch, reading memory then. */
UNIT_TEST(fake_cuda_graph_replays_its_nodes_in_order)
{
    load("MAPPING_TEST_FAKE_CUDA", NULL, 0);
    void *s = stream_new(1), *graph = NULL, *exec = NULL;
    dptr_t a = dev_alloc(64), b = dev_alloc(64);
    unsigned char *host = NULL, back[64];
    CU_OK(CU(r_t (*)(void **, size_t, unsigned), "cuMemHostAlloc")((void **)&host, 64, 0));
    typedef r_t (*htod_fn)(dptr_t, const void *, size_t, void *);
    typedef r_t (*dtod_fn)(dptr_t, dptr_t, size_t, void *);
    CU_OK(CU(begin_fn, "cuStreamBeginCapture_v2")(s, 0));
    CU_OK(CU(htod_fn, "cuMemcpyHtoDAsync_v2")(a, host, 64, s));
    CU_OK(CU(r_t (*)(dptr_t, unsigned char, size_t, void *), "cuMemsetD8Async")(a, 9, 8, s));
    CU_OK(CU(dtod_fn, "cuMemcpyDtoDAsync_v2")(b, a, 64, s));
    CU_OK(CU(end_fn, "cuStreamEndCapture")(s, &graph));
    CU_OK(CU(r_t (*)(void **, void *, unsigned long long), "cuGraphInstantiateWithFlags")(&exec, graph, 0));
    for (int round = 0; round < 2; round++) {
        memset(host, round + 1, 64);
        CU_OK(CU(r_t (*)(void *, void *), "cuGraphLaunch")(exec, s));
        CU_OK(CU(stream_fn, "cuStreamSynchronize")(s));
        CU_OK(CU(r_t (*)(void *, dptr_t, size_t), "cuMemcpyDtoH_v2")(back, b, 64));
        for (int i = 0; i < 64; i++)
            CHECK(back[i] == (i < 8 ? 9 : round + 1));
    }
    CU_OK(CU(r_t (*)(void *), "cuGraphExecDestroy")(exec));
    CU_OK(CU(r_t (*)(void *), "cuGraphDestroy")(graph));
}
