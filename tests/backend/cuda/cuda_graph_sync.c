/*
 * Graph-replayable mirror syncs on the CUDA back end (cuda_graph.c,
 * src/coherence/mirror_graph.c), and what the fake driver learned for them,
 * each with the refusal a real driver makes:
 * - cuMemHostGetDevicePointer_v2: page-locked memory only, flags 0; the
 *   device address of registered memory differs from the host address;
 * - the table-copy kernel reads its table when it runs, and reaching
 *   pageable memory (or registered memory by its host address) is an
 *   illegal address;
 * - user objects: the flag the driver requires, the destructor run when the
 *   graph and its executables are gone, and no driver call inside it.
 * UNIT_TESTs load the fake directly, each in its own process.
 */
#include <pthread.h>
#include "backend/cuda/cuda_kernels_ptx.h"
#include "fake_driver.h"

enum { INVALID_VALUE = 1, ILLEGAL_ADDRESS = 700, NOT_PERMITTED = 800 };

static void load_fake(void)
{
    const char *path = getenv("MAPPING_TEST_FAKE_CUDA");
    if (!path || !*path)
        test_skip("the fake driver is not built here (MAPPING_TEST_FAKE_CUDA unset)");
    CHECK((lib = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL);
    void *ctx = NULL;
    CU_OK(CU(r_t (*)(unsigned), "cuInit")(0));
    CU_OK(CU(r_t (*)(void **, int), "cuDevicePrimaryCtxRetain")(&ctx, 0));
    CU_OK(CU(r_t (*)(void *), "cuCtxPushCurrent_v2")(ctx));
}

typedef r_t (*devptr_fn)(dptr_t *, void *, unsigned);

UNIT_TEST(fake_cuda_gives_device_addresses_of_page_locked_memory_only)
{
    load_fake();
    devptr_fn get = CU(devptr_fn, "cuMemHostGetDevicePointer_v2");
    static unsigned char pageable[8192];
    void *allocated = NULL;
    dptr_t d = 0;
    CU_OK(CU(r_t (*)(void **, size_t, unsigned), "cuMemHostAlloc")(&allocated, 4096, 1));
    CHECK(get(&d, pageable, 0) == INVALID_VALUE);
    CHECK(get(&d, allocated, 1) == INVALID_VALUE); /* flags must be 0 */
    CU_OK(get(&d, (char *)allocated + 8, 0));
    CHECK(d == (dptr_t)(uintptr_t)allocated + 8); /* unified addressing: the same address */
    unsigned char *page = aligned_alloc(4096, 4096);
    CU_OK(CU(r_t (*)(void *, size_t, unsigned), "cuMemHostRegister_v2")(page, 4096, 1));
    CU_OK(get(&d, page, 0));
    CHECK(d != (dptr_t)(uintptr_t)page); /* registered: another address, as some drivers give */
    CU_OK(CU(r_t (*)(void *), "cuMemHostUnregister")(page));
    CHECK(get(&d, page, 0) == INVALID_VALUE);
    free(page);
}

typedef r_t (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);

/* Loads the library's kernels; the table copy's function. */
static void *table_kernel(void)
{
    void *module = NULL, *fn = NULL;
    CU_OK(CU(r_t (*)(void **, const void *), "cuModuleLoadData")(&module, cuda_kernels_ptx));
    CU_OK(CU(r_t (*)(void **, void *, const char *), "cuModuleGetFunction")(&fn, module, "mapping_copy_table"));
    return fn;
}

static r_t launch_table(void *fn, dptr_t table, unsigned long long capacity, dptr_t host, dptr_t dev, unsigned back)
{
    void *params[] = {&table, &capacity, &host, &dev, &back};
    return CU(launch_fn, "cuLaunchKernel")(fn, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL);
}

UNIT_TEST(fake_cuda_table_kernel_reads_its_table_when_it_runs_and_faults_off_mapped_memory)
{
    load_fake();
    void *fn = table_kernel();
    devptr_fn get = CU(devptr_fn, "cuMemHostGetDevicePointer_v2");
    r_t (*sync)(void *) = CU(r_t (*)(void *), "cuStreamSynchronize");
    unsigned long long *table = NULL;
    unsigned char *host = NULL, out[64];
    CU_OK(CU(r_t (*)(void **, size_t, unsigned), "cuMemHostAlloc")((void **)&table, 64, 0));
    CU_OK(CU(r_t (*)(void **, size_t, unsigned), "cuMemHostAlloc")((void **)&host, 64, 0));
    dptr_t mem = 0, t = 0, h = 0;
    CU_OK(CU(r_t (*)(dptr_t *, size_t), "cuMemAlloc_v2")(&mem, 64));
    CU_OK(get(&t, table, 0));
    CU_OK(get(&h, host, 0));
    memset(host, 0x5a, 64);
    table[0] = 1, table[2] = 16, table[3] = 8; /* host[16, 24) -> mem[16, 24) */
    CU_OK(CU(r_t (*)(dptr_t, unsigned char, size_t), "cuMemsetD8_v2")(mem, 0, 64));
    CU_OK(launch_table(fn, t, 2, h, mem, 0));
    CU_OK(sync(NULL));
    CU_OK(CU(r_t (*)(void *, dptr_t, size_t), "cuMemcpyDtoH_v2")(out, mem, 64));
    for (int i = 0; i < 64; i++)
        CHECK(out[i] == (i >= 16 && i < 24 ? 0x5a : 0));
    table[0] = 0; /* a count of 0: nothing */
    CU_OK(launch_table(fn, t, 2, h, mem, 1));
    CU_OK(sync(NULL));
    CHECK(CU(long long (*)(const char *), "fake_cuda_count")("table_copies_empty") >= 1);
    /* The table in pageable memory: an illegal address when it runs. */
    static unsigned long long pageable_table[4] = {1, 0, 0, 8};
    CU_OK(launch_table(fn, (dptr_t)(uintptr_t)pageable_table, 1, h, mem, 0));
    CHECK(sync(NULL) == ILLEGAL_ADDRESS);
}

UNIT_TEST(fake_cuda_table_kernel_faults_on_registered_memory_by_its_host_address)
{
    load_fake();
    void *fn = table_kernel();
    devptr_fn get = CU(devptr_fn, "cuMemHostGetDevicePointer_v2");
    unsigned long long *table = NULL;
    CU_OK(CU(r_t (*)(void **, size_t, unsigned), "cuMemHostAlloc")((void **)&table, 64, 0));
    unsigned char *page = aligned_alloc(4096, 4096);
    CU_OK(CU(r_t (*)(void *, size_t, unsigned), "cuMemHostRegister_v2")(page, 4096, 1));
    dptr_t mem = 0, t = 0, h = 0;
    CU_OK(CU(r_t (*)(dptr_t *, size_t), "cuMemAlloc_v2")(&mem, 4096));
    CU_OK(get(&t, table, 0));
    CU_OK(get(&h, page, 0));
    table[0] = 1, table[2] = 0, table[3] = 4096;
    CU_OK(launch_table(fn, t, 1, h, mem, 1)); /* by its device address: fine */
    CU_OK(CU(r_t (*)(void *), "cuStreamSynchronize")(NULL));
    CU_OK(launch_table(fn, t, 1, (dptr_t)(uintptr_t)page, mem, 1)); /* by its host address */
    CHECK(CU(r_t (*)(void *), "cuStreamSynchronize")(NULL) == ILLEGAL_ADDRESS);
}

static r_t in_destructor = -1;
static int destructor_runs;
static void destructor(void *user)
{
    dptr_t p = 0;
    (void)user;
    destructor_runs++;
    in_destructor = CU(r_t (*)(dptr_t *, size_t), "cuMemAlloc_v2")(&p, 64);
}

UNIT_TEST(fake_cuda_user_objects_end_with_their_graph_and_may_not_call_the_driver)
{
    load_fake();
    typedef r_t (*create_fn)(void **, void *, void (*)(void *), unsigned, unsigned);
    create_fn create = CU(create_fn, "cuUserObjectCreate");
    void *obj = NULL, *s = NULL, *graph = NULL, *exec = NULL;
    CHECK(create(&obj, NULL, destructor, 1, 0) == INVALID_VALUE); /* CU_USER_OBJECT_NO_DESTRUCTOR_SYNC is required */
    CU_OK(create(&obj, NULL, destructor, 1, 1));
    CU_OK(CU(r_t (*)(void **, unsigned), "cuStreamCreate")(&s, 1));
    CU_OK(CU(r_t (*)(void *, int), "cuStreamBeginCapture_v2")(s, 0));
    int status = 0;
    unsigned long long id = 0;
    CU_OK(CU(r_t (*)(void *, int *, unsigned long long *, void **, const void **, size_t *),
             "cuStreamGetCaptureInfo_v2")(s, &status, &id, &graph, NULL, NULL));
    CHECK(status == 1 && graph != NULL);
    r_t (*retain)(void *, void *, unsigned, unsigned) = CU(r_t (*)(void *, void *, unsigned, unsigned),
                                                           "cuGraphRetainUserObject");
    CHECK(retain(graph, obj, 1, 2) == INVALID_VALUE); /* unknown flag */
    CU_OK(retain(graph, obj, 1, 1));                  /* CU_GRAPH_USER_OBJECT_MOVE */
    CU_OK(CU(r_t (*)(void *, void **), "cuStreamEndCapture")(s, &graph));
    CU_OK(CU(r_t (*)(void **, void *, unsigned long long), "cuGraphInstantiateWithFlags")(&exec, graph, 0));
    CU_OK(CU(r_t (*)(void *), "cuGraphDestroy")(graph));
    CHECK(destructor_runs == 0); /* the executable holds it */
    CU_OK(CU(r_t (*)(void *, void *), "cuGraphLaunch")(exec, s));
    CU_OK(CU(r_t (*)(void *), "cuGraphExecDestroy")(exec));
    CU_OK(CU(r_t (*)(void *), "cuStreamSynchronize")(s)); /* the launch's hold goes when it ends */
    CHECK(destructor_runs == 1);
    CHECK(in_destructor == NOT_PERMITTED);
}

/* ---- the back end, on every CUDA driver the tests have ---- */

static r_t (*drv_begin)(void *, int);
static r_t (*drv_end)(void *, void **);
static r_t (*drv_instantiate)(void **, void *, unsigned long long);
static r_t (*drv_launch)(void *, void *);
static r_t (*drv_exec_destroy)(void *);
static r_t (*drv_destroy)(void *);
static r_t (*drv_push)(void *);
static r_t (*drv_pop)(void **);
static long long (*drv_count)(const char *);

static void *driver_sym(void *l, const char *name)
{
    void *s = dlsym(l, name);
    if (!s)
        test_skip("the CUDA driver has no %s", name);
    return s;
}

#define LOAD_(var, name)                       \
    do {                                       \
        void *sym_ = driver_sym(l, name);      \
        memcpy(&var, &sym_, sizeof sym_);      \
    } while (0)

static void load_driver(void)
{
    const char *path = getenv("MAPPING_CUDA_LIBRARY");
    void *l = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!l)
        test_skip("cannot load the CUDA driver: %s", dlerror());
    LOAD_(drv_begin, "cuStreamBeginCapture_v2");
    LOAD_(drv_end, "cuStreamEndCapture");
    LOAD_(drv_instantiate, "cuGraphInstantiateWithFlags");
    LOAD_(drv_launch, "cuGraphLaunch");
    LOAD_(drv_exec_destroy, "cuGraphExecDestroy");
    LOAD_(drv_destroy, "cuGraphDestroy");
    LOAD_(drv_push, "cuCtxPushCurrent_v2");
    LOAD_(drv_pop, "cuCtxPopCurrent_v2");
    void *count = dlsym(l, "fake_cuda_count");
    memcpy(&drv_count, &count, sizeof count);
}

/* A replay of a graph of two syncs with nothing stale makes no copy of any
 * kind (no DMA, no driver call from its host nodes: the fake would refuse
 * them), and one with stale bytes moves them through the table kernel; the
 * kernel was loaded at open (no lazy load at the first replay). */
TEST(cuda_graph_sync_replays_make_no_driver_call_and_move_nothing_when_clean)
{
    mapping_device *dev = test_device();
    load_driver();
    mapping_native_device native;
    mapping_stream *s;
    mapping_mirror *m;
    void *cs = NULL, *graph = NULL, *exec = NULL, *popped;
    CHECK_OK(mapping_device_native(dev, &native));
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_stream_native(s, &cs));
    CHECK_OK(mapping_mirror_create(dev, 1 << 20, 0, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(drv_push(native.context) == 0);
    CHECK(drv_begin(cs, 0) == 0);
    CHECK_OK(mapping_mirror_sync_to_gpu(s, m));
    CHECK_OK(mapping_mirror_sync_to_cpu(s, m));
    CHECK(drv_end(cs, &graph) == 0);
    CHECK(drv_instantiate(&exec, graph, 0) == 0);
    CHECK(drv_pop(&popped) == 0);
    long long lazy = drv_count ? drv_count("lazy_loads") : 0, htod = drv_count ? drv_count("cuMemcpyHtoDAsync") : 0;
    long long empty = drv_count ? drv_count("table_copies_empty") : 0;
    mapping_stats before = test_stats(dev);
    for (int i = 0; i < 3; i++) {
        CHECK(drv_push(native.context) == 0);
        CHECK(drv_launch(exec, cs) == 0);
        CHECK(drv_pop(&popped) == 0);
        CHECK_OK(mapping_stream_synchronize(s));
    }
    mapping_stats after = test_stats(dev);
    CHECK(after.h2d_bytes == before.h2d_bytes && after.d2h_bytes == before.d2h_bytes);
    CHECK(after.graph_sync_runs - before.graph_sync_runs == 6);
    if (drv_count) {
        CHECK(drv_count("lazy_loads") == lazy);
        CHECK(drv_count("cuMemcpyHtoDAsync") == htod);
        CHECK(drv_count("table_copies_empty") - empty == 6);
    }
    memset(mapping_mirror_cpu(m), 9, 100);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, 100));
    CHECK(drv_push(native.context) == 0);
    CHECK(drv_launch(exec, cs) == 0);
    CHECK(drv_pop(&popped) == 0);
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK(test_stats(dev).h2d_payload_bytes - after.h2d_payload_bytes == 100);
    test_check_mirror_sides_equal(m);
    CHECK(drv_push(native.context) == 0);
    CHECK(drv_exec_destroy(exec) == 0 && drv_destroy(graph) == 0);
    CHECK(drv_pop(&popped) == 0);
    mapping_mirror_destroy(m);
    mapping_stream_destroy(s);
}
