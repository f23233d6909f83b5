/*
 * Write-tracking mirrors (MAPPING_MIRROR_TRACK_WRITES): the program never
 * marks a CPU write, and every sync still carries it. The mechanism is the
 * process's ($MAPPING_TRACK; tests/CMakeLists.txt runs these tests once per
 * mechanism). A model-based random test writes with memset, single stores,
 * memcpy, another thread and read(2) from a pipe, writes device ranges
 * (marked: device writes are not tracked), and syncs both ways, blocking and
 * on a stream; after every sync the target side must hold the model's bytes.
 * Seeds are printed; MAPPING_TEST_SEED=<n> runs that round alone.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <stdbool.h>
#include <unistd.h>
#include "harness.h"

static size_t page(void)
{
    size_t g = 0;
    mapping_write_tracking(&g);
    return g;
}

/* The tests need a mechanism; under MAPPING_TRACK=none the refusal is the test. */
static void need_tracking(void)
{
    if (mapping_write_tracking(NULL) == MAPPING_TRACK_NONE)
        test_skip("no write tracking here: %s", mapping_write_tracking_description());
}

/* A tracked mirror of n bytes, synced to the device once (nothing stale). */
static mapping_mirror *synced_tracked_mirror(mapping_device *dev, size_t n)
{
    mapping_mirror *m = NULL;
    CHECK_OK(mapping_mirror_create(dev, n, MAPPING_MIRROR_TRACK_WRITES, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    return m;
}

static void device_bytes(mapping_mirror *m, unsigned char *out)
{
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), out,
                                       mapping_mirror_size(m)));
}

TEST(tracking_reports_its_mechanism_and_a_page_granularity)
{
    size_t g = 0;
    mapping_track_mechanism k = mapping_write_tracking(&g);
    const char *d = mapping_write_tracking_description();
    CHECK(d != NULL);
    CHECK(g >= 4096 && (g & (g - 1)) == 0);
    const char *env = getenv("MAPPING_TRACK");
    if (env && strcmp(env, "none") == 0)
        CHECK(k == MAPPING_TRACK_NONE);
    if (env && strcmp(env, "mprotect") == 0)
        CHECK(k == MAPPING_TRACK_MPROTECT);
    if (env && strcmp(env, "uffd") == 0)
        CHECK(k == MAPPING_TRACK_UFFD || k == MAPPING_TRACK_NONE);
    CHECK(strncmp(d, k == MAPPING_TRACK_UFFD ? "uffd" : k == MAPPING_TRACK_MPROTECT ? "mprotect" : "none",
                  k == MAPPING_TRACK_MPROTECT ? 8 : 4) == 0);
}

TEST(tracked_mirror_is_refused_without_a_mechanism)
{
    mapping_device *dev = test_device();
    CHECK_REFUSED(mapping_multimirror_track_writes(NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(!mapping_mirror_is_tracked(NULL));
    mapping_mirror *m = NULL;
    if (mapping_write_tracking(NULL) != MAPPING_TRACK_NONE) {
        CHECK_OK(mapping_mirror_create(dev, 4096, MAPPING_MIRROR_TRACK_WRITES, &m));
        CHECK(mapping_mirror_is_tracked(m));
        mapping_mirror_destroy(m);
        return;
    }
    CHECK_STATUS(mapping_mirror_create(dev, 4096, MAPPING_MIRROR_TRACK_WRITES, &m), MAPPING_ERR_UNSUPPORTED);
    CHECK(m == NULL);
    CHECK(strstr(mapping_last_error_message(), "MAPPING_MIRROR_TRACK_WRITES") != NULL);
}

/* The tracker reports the written page; the shadow of the CPU side tells
 * which of its bytes changed: one. */
TEST(tracked_sync_of_one_written_byte_moves_one_byte)
{
    need_tracking();
    mapping_device *dev = test_device();
    size_t n = 256 * page();
    mapping_mirror *m = synced_tracked_mirror(dev, n);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    unsigned char *cpu = mapping_mirror_cpu(m);
    cpu[100 * page() + 7] = 0x5a; /* no mark */
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 1);
    cpu[100 * page() + 9] = cpu[100 * page() + 9]; /* a write of the same value changes nothing */
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 1);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    unsigned char *got = malloc(n);
    device_bytes(m, got);
    CHECK(got[100 * page() + 7] == 0x5a);
    CHECK(got[100 * page() + 6] == 0);
    /* A clean sync moves nothing. */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    free(got);
    mapping_mirror_destroy(m);
}

/* A streaming write of many pages: every written byte goes up, and only
 * those (mprotect's widening runs and uffd's open runs report more pages
 * than were written; the shadow finds the bytes that changed in them);
 * isolated bytes afterwards are still one byte each. */
TEST(tracked_streaming_write_sends_every_written_byte_and_isolated_writes_stay_one_byte)
{
    need_tracking();
    mapping_device *dev = test_device();
    size_t n = 1024 * page(), lo = 100 * page() + 5, len = 600 * page();
    mapping_mirror *m = synced_tracked_mirror(dev, n);
    unsigned char *cpu = mapping_mirror_cpu(m), *got = malloc(n);
    memset(cpu + lo, 0x3c, len); /* no mark */
    size_t stale = mapping_mirror_stale_bytes(m, MAPPING_GPU);
    CHECK(stale == len);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    device_bytes(m, got);
    CHECK_BYTES(got, cpu, n);
    for (int k = 0; k < 5; k++) /* isolated writes, 7 pages apart */
        cpu[900 * page() + (size_t)k * 7 * page()] = (unsigned char)(k + 1);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 5);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    device_bytes(m, got);
    CHECK_BYTES(got, cpu, n);
    free(got);
    mapping_mirror_destroy(m);
}

/* Installs a SIGSEGV handler: info (SA_SIGINFO) or plain, with flags and
 * an empty mask; 0 or -1 as sigaction. previous may be NULL. */
static int segv_install(void (*info)(int, siginfo_t *, void *), void (*plain)(int), int flags,
                        struct sigaction *previous)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    if (info)
        sa.sa_sigaction = info;
    else
        sa.sa_handler = plain;
    sa.sa_flags = flags | (info ? SA_SIGINFO : 0);
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGSEGV, &sa, previous);
}

/* A fault on a page the library does not watch goes to the SIGSEGV handler
 * installed before the library's (here: one that opens its own page). */
static void *user_page;
static volatile sig_atomic_t user_faults;

static void user_segv(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)ctx;
    uintptr_t at = (uintptr_t)info->si_addr, base = (uintptr_t)user_page;
    if (at < base || at >= base + (uintptr_t)sysconf(_SC_PAGESIZE))
        abort();
    user_faults++;
    mprotect(user_page, (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE);
}

TEST(tracked_mirror_passes_other_faults_to_the_handler_installed_before)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    user_page = mmap(NULL, pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(user_page != MAP_FAILED);
    CHECK(segv_install(user_segv, NULL, 0, NULL) == 0); /* before the library installs its own */
    need_tracking();
    mapping_device *dev = test_device();
    size_t n = 16 * page();
    mapping_mirror *m = synced_tracked_mirror(dev, n);
    unsigned char *cpu = mapping_mirror_cpu(m);
    cpu[3 * page()] = 0x11;                /* the library's fault (mprotect) or none (uffd) */
    ((volatile unsigned char *)user_page)[5] = 0x22; /* not the library's: the user's handler */
    CHECK(user_faults == 1);
    CHECK(((unsigned char *)user_page)[5] == 0x22);
    cpu[9 * page()] = 0x33;
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    unsigned char *got = malloc(n);
    device_bytes(m, got);
    CHECK(got[3 * page()] == 0x11 && got[9 * page()] == 0x33);
    CHECK(user_faults == 1);
    free(got);
    mapping_mirror_destroy(m);
    munmap(user_page, pg);
}

TEST(tracked_copy_from_the_device_is_not_sent_back)
{
    need_tracking();
    mapping_device *dev = test_device();
    size_t n = 16 * page();
    mapping_mirror *m = synced_tracked_mirror(dev, n);
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), 2 * page(), 4 * page(), 0x33));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 2 * page(), 4 * page()));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    unsigned char *cpu = mapping_mirror_cpu(m);
    CHECK(cpu[2 * page()] == 0x33 && cpu[6 * page() - 1] == 0x33 && cpu[6 * page()] == 0);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    /* The CPU writes next to a device result on one page: both survive. */
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), 8 * page(), 100, 0x44));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 8 * page(), 100));
    cpu[8 * page() + 200] = 0x55;
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    unsigned char *got = malloc(n);
    device_bytes(m, got);
    CHECK(got[8 * page()] == 0x44 && got[8 * page() + 99] == 0x44 && got[8 * page() + 200] == 0x55);
    CHECK(cpu[8 * page()] == 0x44 && cpu[8 * page() + 200] == 0x55);
    free(got);
    mapping_mirror_destroy(m);
}

/* A copy from the device on a stream: its writes are forgotten when the
 * stream gets there, not when a later call folds the copy into the state.
 * A program write made after the stream was synchronised and before that
 * later call (a stale count, a mark, a query) must still go up. */
TEST(tracked_write_after_an_async_copy_from_the_device_completes_is_not_forgotten)
{
    need_tracking();
    mapping_device *dev = test_device();
    size_t n = 16 * page();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    unsigned char *got = malloc(n);
    for (int between = 0; between < 5; between++) {
        mapping_mirror *m = synced_tracked_mirror(dev, n);
        unsigned char *cpu = mapping_mirror_cpu(m);
        CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), 2 * page(), 2 * page(), 0x33));
        CHECK_OK(mapping_mirror_mark_gpu_modified(m, 2 * page(), 2 * page()));
        CHECK_OK(mapping_mirror_sync_to_cpu(s, m));
        CHECK_OK(mapping_stream_synchronize(s));
        if (between == 4) { /* the copy's own writes count for nothing: nothing goes back up */
            CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
            mapping_mirror_destroy(m);
            continue;
        }
        cpu[2 * page() + 10] = 0x77; /* no mark */
        if (between == 1)
            CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) >= 1);
        else if (between == 2)
            CHECK_OK(mapping_mirror_mark_cpu_modified(m, 12 * page(), 1));
        else if (between == 3) {
            int needs = 0;
            CHECK_OK(mapping_mirror_needs_sync(m, MAPPING_GPU, &needs));
            CHECK(needs == 1);
        }
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        device_bytes(m, got);
        CHECK(memcmp(got, cpu, n) == 0);
        CHECK(got[2 * page() + 10] == 0x77 && got[2 * page()] == 0x33);
        mapping_mirror_destroy(m);
    }
    /* The mirror destroyed while its clear is still queued behind other work. */
    mapping_mirror *m = synced_tracked_mirror(dev, n);
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), 0, n, 0x21));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, n));
    CHECK_OK(mapping_mirror_sync_to_cpu(s, m));
    mapping_mirror_destroy(m);
    CHECK_OK(mapping_stream_synchronize(s));
    free(got);
    mapping_stream_destroy(s);
}

static int pipe_fill(int fd[2], unsigned char value, size_t bytes)
{
    unsigned char buf[512];
    memset(buf, value, sizeof buf);
    for (size_t done = 0; done < bytes;) {
        size_t k = bytes - done < sizeof buf ? bytes - done : sizeof buf;
        if (write(fd[1], buf, k) != (ssize_t)k)
            return -1;
        done += k;
    }
    return 0;
}

TEST(tracked_read_from_a_pipe_into_the_array)
{
    need_tracking();
    mapping_device *dev = test_device();
    size_t n = 8 * page();
    mapping_mirror *m = synced_tracked_mirror(dev, n);
    unsigned char *cpu = mapping_mirror_cpu(m), *got = malloc(n);
    int fd[2];
    CHECK(pipe(fd) == 0);
    CHECK(pipe_fill(fd, 0x77, 300) == 0);
    if (mapping_write_tracking(NULL) == MAPPING_TRACK_UFFD) {
        /* The kernel's write is tracked like the program's. */
        CHECK(read(fd[0], cpu + 3 * page() + 10, 300) == 300);
    } else {
        /* mprotect: the kernel cannot write a protected page (documented);
         * a mark first makes the pages writable. */
        errno = 0;
        CHECK(read(fd[0], cpu + 3 * page() + 10, 300) == -1 && errno == EFAULT);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, 3 * page() + 10, 300));
        CHECK(read(fd[0], cpu + 3 * page() + 10, 300) == 300);
    }
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    device_bytes(m, got);
    CHECK(got[3 * page() + 9] == 0 && got[3 * page() + 10] == 0x77 && got[3 * page() + 309] == 0x77 &&
          got[3 * page() + 310] == 0);
    /* After the sync the pages are watched again: a store is tracked. */
    cpu[3 * page() + 11] = 1;
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    device_bytes(m, got);
    CHECK(got[3 * page() + 11] == 1);
    close(fd[0]);
    close(fd[1]);
    free(got);
    mapping_mirror_destroy(m);
}

TEST(tracked_wrap_with_views_moves_only_each_views_pages)
{
    need_tracking();
    mapping_device *dev = test_device();
    size_t pg = page(), n = 32 * pg;
    unsigned char *mem = aligned_alloc(pg, n);
    CHECK(mem != NULL);
    memset(mem, 0, n);
    mapping_mirror *m, *a, *b, *again = NULL;
    CHECK_OK(mapping_mirror_wrap(dev, mem, n, MAPPING_MIRROR_TRACK_WRITES | MAPPING_MIRROR_PIN, &m));
    CHECK(mapping_mirror_is_tracked(m));
    /* Another family on the same pages would take this one's writes. */
    CHECK_STATUS(mapping_mirror_wrap(dev, mem + 5, 10, MAPPING_MIRROR_TRACK_WRITES, &again), MAPPING_ERR_UNSUPPORTED);
    CHECK_OK(mapping_mirror_view(m, 0, 16 * pg, &a));
    CHECK_OK(mapping_mirror_view(m, 16 * pg, 16 * pg, &b));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mem[3 * pg] = 1;
    mem[20 * pg + 5] = 2;
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, a)); /* a's byte only */
    CHECK(mapping_mirror_stale_bytes(a, MAPPING_GPU) == 0);
    CHECK(mapping_mirror_stale_bytes(b, MAPPING_GPU) == 1);
    unsigned char *got = malloc(n);
    device_bytes(m, got);
    CHECK(got[3 * pg] == 1 && got[20 * pg + 5] == 0);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, b));
    device_bytes(m, got);
    CHECK(got[20 * pg + 5] == 2);
    mapping_mirror_destroy(a);
    mapping_mirror_destroy(b);
    mapping_mirror_destroy(m);
    /* Destroyed: the memory is the caller's again, writable, untracked. */
    mem[7] = 9;
    CHECK_OK(mapping_mirror_wrap(dev, mem, n, MAPPING_MIRROR_TRACK_WRITES, &m));
    mapping_mirror_destroy(m);
    free(got);
    free(mem);
}

/* ---- the model-based random test ---- */

enum { MODEL_PAGES = 48, MODEL_TAIL = 123, ROUNDS = 40, STEPS = 30 };

typedef struct tworld {
    mapping_device *dev;
    mapping_stream *stream;
    mapping_mirror *m;
    unsigned char  *cpu, *model, *got, *src;
    size_t          n;
    /* Device writes marked and not yet synced: the CPU leaves them alone
     * (writing a byte both sides modified is a conflict, not tracked). */
    size_t          gpu_lo[STEPS], gpu_hi[STEPS];
    int             n_gpu;
    int             pipe_fd[2];
    size_t          stream_lo, stream_len; /* the last stream of pages */
    unsigned long long rng;
    unsigned        seed;
} tworld;

static size_t below(tworld *w, size_t n)
{
    return (size_t)(test_xorshift64(&w->rng) % n);
}

#define FAIL_AT(w, ...)                                                                                      \
    do {                                                                                                     \
        fprintf(stderr, "seed %u: ", (w)->seed);                                                             \
        test_fail(__FILE__, __LINE__, __VA_ARGS__);                                                          \
    } while (0)

static bool meets_gpu_write(const tworld *w, size_t lo, size_t hi)
{
    for (int i = 0; i < w->n_gpu; i++)
        if (lo < w->gpu_hi[i] && w->gpu_lo[i] < hi)
            return true;
    return false;
}

static void sync_to(tworld *w, int to_gpu)
{
    mapping_stream *s = below(w, 3) == 0 ? w->stream : NULL;
    mapping_status st = to_gpu ? mapping_mirror_sync_to_gpu(s, w->m) : mapping_mirror_sync_to_cpu(s, w->m);
    if (st != MAPPING_OK)
        FAIL_AT(w, "sync to the %s: %s", to_gpu ? "GPU" : "CPU", mapping_last_error_message());
    if (s)
        CHECK_OK(mapping_stream_synchronize(s));
    if (to_gpu) {
        device_bytes(w->m, w->got);
        for (size_t i = 0; i < w->n; i++)
            if (w->got[i] != w->model[i] && !meets_gpu_write(w, i, i + 1))
                FAIL_AT(w, "device byte %zu is 0x%02x, the model 0x%02x", i, w->got[i], w->model[i]);
    } else {
        w->n_gpu = 0;
        for (size_t i = 0; i < w->n; i++)
            if (w->cpu[i] != w->model[i])
                FAIL_AT(w, "CPU byte %zu is 0x%02x, the model 0x%02x", i, w->cpu[i], w->model[i]);
    }
}

typedef struct thread_write {
    unsigned char *dst;
    size_t         bytes;
    unsigned char  value;
} thread_write;

static void *thread_writer(void *arg)
{
    thread_write *t = arg;
    for (size_t i = 0; i < t->bytes; i++)
        t->dst[i] = (unsigned char)(t->value + i);
    return NULL;
}

static void cpu_write(tworld *w)
{
    size_t len = below(w, 4) == 0 ? 1 + below(w, 3 * page()) : 1 + below(w, 200);
    bool stream = below(w, 6) == 0; /* a stream of pages (with MAPPING_TRACK_STREAMS small: an open run) */
    if (stream)
        len = (8 + below(w, 32)) * page() + below(w, page());
    size_t lo = below(w, w->n - len + 1), hi = lo + len;
    if (stream && w->stream_len && below(w, 2) == 0) { /* the last stream again */
        lo = w->stream_lo;
        len = w->stream_len;
        hi = lo + len;
    }
    if (stream) {
        w->stream_lo = lo;
        w->stream_len = len;
    }
    if (meets_gpu_write(w, lo, hi))
        sync_to(w, 0);
    unsigned char v = (unsigned char)test_xorshift64(&w->rng);
    static const int stream_ops[] = {0, 2, 3}; /* memset, memcpy, another thread */
    switch (stream ? stream_ops[below(w, 3)] : (int)below(w, 5)) {
    case 0:
        memset(w->cpu + lo, v, len);
        break;
    case 1:
        w->cpu[lo] = v;
        len = 1;
        break;
    case 2:
        for (size_t i = 0; i < len; i++)
            w->src[i] = (unsigned char)(v * 31 + i);
        memcpy(w->cpu + lo, w->src, len);
        break;
    case 3: {
        thread_write t = {w->cpu + lo, len, v};
        pthread_t th;
        CHECK(pthread_create(&th, NULL, thread_writer, &t) == 0);
        CHECK(pthread_join(th, NULL) == 0);
        break;
    }
    default: {
        len = len > 400 ? 400 : len; /* within the pipe's buffer */
        CHECK(pipe_fill(w->pipe_fd, v, len) == 0);
        if (mapping_write_tracking(NULL) == MAPPING_TRACK_MPROTECT) /* the documented rule: mark before */
            CHECK_OK(mapping_mirror_mark_cpu_modified(w->m, lo, len));
        if (read(w->pipe_fd[0], w->cpu + lo, len) != (ssize_t)len)
            FAIL_AT(w, "read(2) into the array: %s", strerror(errno));
        break;
    }
    }
    memcpy(w->model + lo, w->cpu + lo, len);
}

static void gpu_write(tworld *w)
{
    if (w->n_gpu == STEPS)
        sync_to(w, 0);
    size_t len = 1 + below(w, 2 * page());
    size_t lo = below(w, w->n - len + 1);
    unsigned char v = (unsigned char)test_xorshift64(&w->rng);
    /* The CPU side must hold everything the CPU wrote before the device
     * range is marked: a sync first (tracked writes under it would
     * otherwise be a conflict the page granularity cannot see). */
    sync_to(w, 1);
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(w->m), mapping_mirror_gpu_offset(w->m) + lo, len, v));
    if (mapping_mirror_mark_gpu_modified(w->m, lo, len) != MAPPING_OK)
        FAIL_AT(w, "mark_gpu_modified: %s", mapping_last_error_message());
    memset(w->model + lo, v, len);
    w->gpu_lo[w->n_gpu] = lo;
    w->gpu_hi[w->n_gpu++] = lo + len;
}

static void model_round(tworld *w)
{
    CHECK_OK(mapping_mirror_create(w->dev, w->n, MAPPING_MIRROR_TRACK_WRITES, &w->m));
    w->cpu = mapping_mirror_cpu(w->m);
    memset(w->model, 0, w->n);
    w->n_gpu = 0;
    w->stream_len = 0;
    sync_to(w, 1);
    for (int step = 0; step < STEPS; step++) {
        size_t op = below(w, 10);
        if (op < 6)
            cpu_write(w);
        else if (op < 7)
            gpu_write(w);
        else if (op < 9)
            sync_to(w, 1);
        else
            sync_to(w, 0);
    }
    sync_to(w, 0);
    sync_to(w, 1);
    mapping_mirror_destroy(w->m);
}

TEST(tracked_mirror_without_marks_matches_a_byte_model)
{
    need_tracking();
    tworld *w = calloc(1, sizeof *w);
    w->dev = test_device();
    w->n = MODEL_PAGES * page() + MODEL_TAIL;
    w->model = malloc(w->n);
    w->got = malloc(w->n);
    w->src = malloc(w->n);
    CHECK(pipe(w->pipe_fd) == 0);
    CHECK_OK(mapping_stream_create(w->dev, &w->stream));
    const char *only = getenv("MAPPING_TEST_SEED");
    for (int r = 0; r < ROUNDS; r++) {
        w->seed = only ? (unsigned)strtoul(only, NULL, 0) : 1000u + (unsigned)r;
        w->rng = 0x9e3779b97f4a7c15ull ^ w->seed;
        model_round(w);
        if (only)
            break;
    }
    printf("%d rounds of %d steps, mechanism %s\n", only ? 1 : ROUNDS, STEPS, mapping_write_tracking_description());
    mapping_stream_destroy(w->stream);
    close(w->pipe_fd[0]);
    close(w->pipe_fd[1]);
    free(w->model);
    free(w->got);
    free(w->src);
    free(w);
}

TEST(tracked_multimirror_sends_written_bytes_without_marks)
{
    mapping_device *dev = test_device();
    size_t pg = page(), n = 16 * pg;
    mapping_multimirror *m;
    CHECK_OK(mapping_multimirror_create(&dev, 1, n, &m));
    if (mapping_write_tracking(NULL) == MAPPING_TRACK_NONE) {
        CHECK_STATUS(mapping_multimirror_track_writes(m), MAPPING_ERR_UNSUPPORTED);
        mapping_multimirror_destroy(m);
        return;
    }
    CHECK_OK(mapping_multimirror_track_writes(m));
    CHECK_OK(mapping_multimirror_track_writes(m)); /* again: a no-op */
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 0));
    unsigned char *cpu = mapping_multimirror_cpu(m), *got = malloc(n);
    cpu[9 * pg + 3] = 0x21; /* no mark: the byte that changed */
    CHECK(mapping_multimirror_stale_bytes(m, 0) == 1);
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 0));
    CHECK(mapping_multimirror_stale_bytes(m, 0) == 0);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_multimirror_gpu(m, 0), 0, got, n));
    CHECK(got[9 * pg + 3] == 0x21 && got[9 * pg + 2] == 0);
    /* A device result copied back is not sent up again. */
    CHECK_OK(mapping_fill_gpu(NULL, mapping_multimirror_gpu(m, 0), 2 * pg, 2 * pg, 0x42));
    CHECK_OK(mapping_multimirror_mark_gpu_modified(m, 0, 2 * pg, 2 * pg));
    CHECK_OK(mapping_multimirror_sync_to_cpu(m));
    CHECK(cpu[2 * pg] == 0x42 && cpu[4 * pg - 1] == 0x42);
    CHECK(mapping_multimirror_stale_bytes(m, 0) == 0);
    free(got);
    mapping_multimirror_destroy(m);
}

TEST(tracked_mirror_refuses_a_bad_track_streams_value)
{
    mapping_device *dev = test_device();
    static const char *const bad[] = {"sometimes", "12345",   "4096",  "-65536",        "65536x", "99999999999999999999999",
                                      " 65536",    "65536 ",  "0",     "+65536",        "0x10000", "2199023255552",
                                      "ON",        "Off",     "1e6"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("MAPPING_TRACK_STREAMS", bad[i], 1);
        mapping_mirror *m = NULL;
        mapping_status st = mapping_mirror_create(dev, 4096, MAPPING_MIRROR_TRACK_WRITES, &m);
        CHECK(st == MAPPING_ERR_INVALID_ARGUMENT && m == NULL);
        CHECK(strstr(mapping_last_error_message(), "MAPPING_TRACK_STREAMS") != NULL);
        if (mapping_write_tracking(NULL) != MAPPING_TRACK_NONE) { /* a multimirror asks when tracking starts */
            mapping_multimirror *mm = NULL;
            mapping_device *devs[] = {dev};
            CHECK_OK(mapping_multimirror_create(devs, 1, 4096, &mm));
            CHECK(mapping_multimirror_track_writes(mm) == MAPPING_ERR_INVALID_ARGUMENT);
            CHECK(strstr(mapping_last_error_message(), "MAPPING_TRACK_STREAMS") != NULL);
            mapping_multimirror_destroy(mm);
        }
        unsetenv("MAPPING_TRACK_STREAMS");
    }
    static const char *const good[] = {"", "on", "off", "65536", "8388608"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        setenv("MAPPING_TRACK_STREAMS", good[i], 1);
        mapping_mirror *m = NULL;
        mapping_status st = mapping_mirror_create(dev, 4096, MAPPING_MIRROR_TRACK_WRITES, &m);
        unsetenv("MAPPING_TRACK_STREAMS");
        if (mapping_write_tracking(NULL) == MAPPING_TRACK_NONE)
            CHECK(st == MAPPING_ERR_UNSUPPORTED);
        else
            CHECK_OK(st);
        mapping_mirror_destroy(m);
    }
}

/* A variable's value to put back with env_restore (NULL: unset). */
static char *env_save(const char *name)
{
    const char *was = getenv(name);
    return was ? strdup(was) : NULL;
}

static void env_restore(const char *name, char *saved)
{
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
}

/* The minor faults of this thread so far (uffd: one per first write to a
 * protected page). */
static long thread_faults(void)
{
    struct rusage u;
    CHECK(getrusage(RUSAGE_THREAD, &u) == 0);
    return u.ru_minflt;
}

/* A streaming write, and the faults it took. */
static long stream_faults(unsigned char *dst, int value, size_t bytes)
{
    long f0 = thread_faults();
    memset(dst, value, bytes);
    return thread_faults() - f0;
}

static void check_device_equals_cpu(mapping_mirror *m, unsigned char *got)
{
    device_bytes(m, got);
    CHECK_BYTES(got, mapping_mirror_cpu(m), mapping_mirror_size(m));
}

/* uffd, MAPPING_TRACK_STREAMS: a run written whole in two periods in a
 * row (a stream repeated; a one-time fill opens nothing) is left writable
 * (open) and reported written at every sync (the shadow then finds the
 * bytes that changed: a sync stays exact), so the next streaming write
 * faults only on its sample pages (one every open_min / 4); the device copy
 * stays exact through a download into the run; once the stream stops, the
 * run closes at the next sync to the device, and a stream faults on every
 * page again. With MAPPING_TRACK_STREAMS=off every page faults at every
 * stream. */
TEST(tracked_streaming_writes_open_a_run_that_closes_when_they_stop)
{
    need_tracking();
    bool uffd = mapping_write_tracking(NULL) == MAPPING_TRACK_UFFD;
    char *saved = env_save("MAPPING_TRACK_STREAMS");
    mapping_device *dev = test_device();
    size_t pg = page(), n = 256 * pg, lo = 32 * pg, run = 128 * pg, pages = run / pg;
    unsigned char *got = malloc(n);
    CHECK(got != NULL);
    char open_min[32];
    snprintf(open_min, sizeof open_min, "%zu", 16 * pg); /* samples every 4 pages */
    setenv("MAPPING_TRACK_STREAMS", open_min, 1);
    mapping_mirror *m = synced_tracked_mirror(dev, n);
    unsigned char *cpu = mapping_mirror_cpu(m);
    long first = stream_faults(cpu + lo, 1, run);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* finds the run written once: still closed */
    check_device_equals_cpu(m, got);
    cpu[220 * pg] = 0x21; /* an isolated write is one byte: the fill opened nothing */
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 1);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    /* Two streams in a row (the isolated write between forgot the fill). */
    long again = stream_faults(cpu + lo, 4, run);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    check_device_equals_cpu(m, got);
    long twice = stream_faults(cpu + lo, 5, run);
    again = twice < again ? twice : again;
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* the same run written again: opens it */
    check_device_equals_cpu(m, got);
    /* The device writes inside the open run; the download is the library's write. */
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m) + lo + 5 * pg + 3, 3 * pg, 0x6d));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, lo + 5 * pg + 3, 3 * pg));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK(cpu[lo + 5 * pg + 3] == 0x6d && cpu[lo + 8 * pg + 2] == 0x6d && cpu[lo + 8 * pg + 3] == 5);
    long second = stream_faults(cpu + lo, 2, run);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    check_device_equals_cpu(m, got);
    if (uffd) {
        CHECK(first >= (long)pages && again >= (long)pages); /* every page, while the run is closed */
        CHECK(second <= (long)(pages / 4 + 4)); /* the samples */
    }
    /* The stream stops: isolated writes, the first on a sample page of the
     * run (a header written now and then must not keep it open). Each sync
     * is exact; the run closes. */
    size_t sample = lo;
    while (((uintptr_t)cpu + sample) % (4 * pg))
        sample++;
    cpu[sample] = 0x99;
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 1); /* still open, reported whole: one byte changed */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* 1 sample of 32 written: the run closes */
    check_device_equals_cpu(m, got);
    cpu[200 * pg] = 0x80;
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 1);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    check_device_equals_cpu(m, got);
    long third = stream_faults(cpu + lo, 3, run); /* closed: every page faults again */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    check_device_equals_cpu(m, got);
    if (uffd)
        CHECK(third >= (long)pages);
    mapping_mirror_destroy(m);

    setenv("MAPPING_TRACK_STREAMS", "off", 1);
    m = synced_tracked_mirror(dev, n);
    cpu = mapping_mirror_cpu(m);
    for (int k = 0; k < 3; k++) {
        second = stream_faults(cpu + lo, k, run);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        check_device_equals_cpu(m, got);
        if (uffd)
            CHECK(second >= (long)pages);
    }
    cpu[200 * pg] = 0x11;
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 1);
    mapping_mirror_destroy(m);

    /* The smallest run (4 pages: a sample on every page) in a run of 2,048
     * pages: at most 1,024 samples, so the stride widens to 2 pages. */
    snprintf(open_min, sizeof open_min, "%zu", 4 * pg);
    setenv("MAPPING_TRACK_STREAMS", open_min, 1);
    size_t big = 2048 * pg;
    m = synced_tracked_mirror(dev, big);
    cpu = mapping_mirror_cpu(m);
    unsigned char *big_got = malloc(big);
    CHECK(big_got != NULL);
    for (int k = 0; k < 4; k++) {
        second = stream_faults(cpu, 0x40 + k, big);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        check_device_equals_cpu(m, big_got);
    }
    if (uffd)
        CHECK(second <= 1024 + 8); /* not 2,048 */
    free(big_got);
    mapping_mirror_destroy(m);
    env_restore("MAPPING_TRACK_STREAMS", saved);
    free(got);
}

/* A thread keeps writing (whole-run streams, which open runs, and single
 * bytes) while the test thread syncs and counts: no write may be lost to
 * a protection changed under it (a scan, a run opened or closed, a
 * library copy). Once the writer has stopped, one more sync must leave the
 * device equal to the CPU. The writes race the syncs' reads of the same
 * bytes, as a program's would: ThreadSanitizer would report the test's
 * own race, so it is skipped there. */
typedef struct racing_writer {
    unsigned char *cpu;
    size_t         run, n;
    atomic_int     stop;
    atomic_ulong   rounds;
} racing_writer;

static void *racing_writes(void *arg)
{
    racing_writer *w = arg;
    unsigned long long x = 0x243F6A8885A308D3ull;
    for (unsigned v = 1; !atomic_load(&w->stop); v++) {
        memset(w->cpu, (int)(v & 0xff), w->run);
        for (int k = 0; k < 4; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            ((volatile unsigned char *)w->cpu)[x % w->n] = (unsigned char)v;
        }
        atomic_fetch_add(&w->rounds, 1);
    }
    return NULL;
}

TEST(tracked_writes_racing_syncs_are_all_carried_by_the_next_sync)
{
    need_tracking();
    if (TEST_TSAN)
        test_skip("ThreadSanitizer: the writer races the syncs on purpose");
    char *saved = env_save("MAPPING_TRACK_STREAMS");
    mapping_device *dev = test_device();
    size_t pg = page(), n = 96 * pg;
    unsigned char *got = malloc(n);
    CHECK(got != NULL);
    char open_min[32];
    snprintf(open_min, sizeof open_min, "%zu", 8 * pg);
    const char *const settings[] = {open_min, "off"};
    for (int s = 0; s < 2; s++) {
        setenv("MAPPING_TRACK_STREAMS", settings[s], 1);
        mapping_mirror *m = synced_tracked_mirror(dev, n);
        racing_writer w = {.cpu = mapping_mirror_cpu(m), .run = 40 * pg, .n = n};
        atomic_init(&w.stop, 0);
        atomic_init(&w.rounds, 0);
        pthread_t th;
        CHECK(pthread_create(&th, NULL, racing_writes, &w) == 0);
        /* 100 ms of syncs at least (a sync that finds no fault takes ~1 us:
         * a count of syncs would end before the writer ran), and 200 rounds
         * of writes, unless the writer is starved (a loaded machine): 20 s
         * at most. */
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int k = 0;; k++) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            double s = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
            if (s > 20 || (s > 0.1 && atomic_load(&w.rounds) >= 200))
                break;
            if (k % 5 == 4)
                (void)mapping_mirror_stale_bytes(m, MAPPING_GPU);
            else
                CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        }
        atomic_store(&w.stop, 1);
        CHECK(pthread_join(th, NULL) == 0);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        check_device_equals_cpu(m, got);
        CHECK(atomic_load(&w.rounds) >= 1);
        mapping_mirror_destroy(m);
    }
    env_restore("MAPPING_TRACK_STREAMS", saved);
    free(got);
}

TEST(tracked_mirror_refuses_a_bad_track_scan_value)
{
    mapping_device *dev = test_device();
    setenv("MAPPING_TRACK_SCAN", "sometimes", 1);
    mapping_mirror *m = NULL;
    mapping_status st = mapping_mirror_create(dev, 4096, MAPPING_MIRROR_TRACK_WRITES, &m);
    unsetenv("MAPPING_TRACK_SCAN");
    CHECK(st == MAPPING_ERR_INVALID_ARGUMENT && m == NULL);
    CHECK(strstr(mapping_last_error_message(), "MAPPING_TRACK_SCAN") != NULL);
    CHECK_OK(mapping_mirror_create(dev, 4096, 0, &m)); /* untracked mirrors do not read it */
    mapping_mirror_destroy(m);
}

/* hugetlbfs memory: the kernel protects and unprotects a huge page whole, so
 * the first write to it leaves all of it writable, and a scan of one 4 KiB
 * page of it cannot protect it again (uffd falls back to a walk of the
 * region). Every write of every round must still go up. Needs reserved huge
 * pages (vm.nr_hugepages; .ci/run reserves a few). */
TEST(tracked_wrap_of_hugetlb_memory_sends_every_write)
{
    need_tracking();
    size_t huge = 2u << 20, n = 2 * huge;
    unsigned char *a = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (a == MAP_FAILED)
        test_skip("no 2 MiB hugetlbfs page to map (vm.nr_hugepages is 0?): %s", strerror(errno));
    memset(a, 0, n);
    mapping_device *dev = test_device();
    mapping_mirror *m = NULL;
    mapping_status st = mapping_mirror_wrap(dev, a, n, MAPPING_MIRROR_TRACK_WRITES, &m);
    if (mapping_write_tracking(NULL) == MAPPING_TRACK_MPROTECT) {
        /* mprotect cannot protect a base page of a huge page alone: refused,
         * saying so (it used to lose the writes next to a download). */
        CHECK_STATUS(st, MAPPING_ERR_UNSUPPORTED);
        CHECK(strstr(mapping_last_error_message(), "hugetlbfs") != NULL);
        munmap(a, n);
        return;
    }
    CHECK_OK(st);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    unsigned char *got = malloc(n);
    unsigned seed = 12345;
    for (int round = 0; round < 6; round++) {
        /* Round 3 marks the device side modified: a CPU write there before
         * it would be a conflict (as with an explicit mark), so its writes
         * come after the download. */
        int writes = round == 3 ? 0 : 1 + round % 3;
        for (int k = 0; k < writes; k++) {
            seed = seed * 1103515245u + 12345u;
            a[(seed >> 8) % n] = (unsigned char)(round * 16 + k + 1);
        }
        if (round == 4)
            memset(a + huge / 2, 0x5a, huge); /* across both huge pages */
        if (round == 3) { /* a download into part of a huge page, then writes next to it and elsewhere */
            CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m) + 64 * 4096,
                                      256 * 4096, 0x42));
            CHECK_OK(mapping_mirror_mark_gpu_modified(m, 64 * 4096, 256 * 4096));
            CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
            a[100 * 4096 + 1] = 0x81;
            a[400 * 4096 + 2] = 0x91;
        }
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        device_bytes(m, got);
        CHECK(memcmp(got, a, n) == 0);
    }
    free(got);
    mapping_mirror_destroy(m);
    munmap(a, n);
}

/* A program thread writes an array while another wraps it in a tracked
 * mirror and destroys it, again and again. A write that faults just as the
 * mirror ends (mprotect: the region is made writable, then forgotten) is
 * the library's and is retried, never passed to the program's handler as
 * a foreign fault. */
enum { RACE_PAGES = 64 };
static unsigned char *race_array;
static atomic_int race_stop;
static volatile sig_atomic_t foreign_faults;

static void count_foreign_faults(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)ctx;
    uintptr_t at = (uintptr_t)info->si_addr, base = (uintptr_t)race_array;
    if (at - base < (uintptr_t)RACE_PAGES * (uintptr_t)sysconf(_SC_PAGESIZE)) {
        foreign_faults++;
        mprotect(race_array, RACE_PAGES * (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE);
        return;
    }
    abort();
}

static void *write_the_array(void *arg)
{
    (void)arg;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    unsigned v = 0;
    while (!atomic_load_explicit(&race_stop, memory_order_relaxed))
        for (size_t p = 0; p < RACE_PAGES; p++, v++)
            ((volatile unsigned char *)race_array)[p * pg + (v % pg)] = (unsigned char)v;
    return NULL;
}

TEST(tracked_mirror_ended_while_a_thread_writes_its_array_passes_no_fault_on)
{
    need_tracking();
    if (TEST_TSAN)
        test_skip("ThreadSanitizer: the writer races the mirror's end on purpose");
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = RACE_PAGES * pg;
    race_array = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(race_array != MAP_FAILED);
    CHECK(segv_install(count_foreign_faults, NULL, 0, NULL) == 0); /* before the library installs its own (mprotect) */
    mapping_device *dev = test_device();
    atomic_store(&race_stop, 0);
    foreign_faults = 0;
    pthread_t writer;
    CHECK(pthread_create(&writer, NULL, write_the_array, NULL) == 0);
    /* Under ASan 4,000: each wrap copies the array into its shadow, 5x slower instrumented. */
    int rounds = TEST_ASAN ? 4000 : 20000;
    for (int i = 0; i < rounds; i++) {
        mapping_mirror *m;
        CHECK_OK(mapping_mirror_wrap(dev, race_array, n, MAPPING_MIRROR_TRACK_WRITES, &m));
        mapping_mirror_destroy(m);
    }
    atomic_store(&race_stop, 1);
    CHECK(pthread_join(writer, NULL) == 0);
    CHECK(foreign_faults == 0);
    munmap(race_array, n);
}

/* Signal chaining, each case in a forked child (handlers are per process,
 * and a case ends in a crash). The child uses the host back end and dies
 * by SIGALRM if a handler loops. */
static int chain_pipe[2];
static volatile sig_atomic_t chain_calls;

static void one_shot_segv(int sig)
{
    (void)sig;
    chain_calls++;
    ssize_t w = write(chain_pipe[1], "h", 1); /* returns: the fault comes again */
    (void)w;
}

static mapping_mirror *child_tracked_mirror(mapping_device **dev, size_t n)
{
    mapping_device_desc desc = {.backend = "host"};
    mapping_mirror *m = NULL;
    if (mapping_open(&desc, dev) || mapping_mirror_create(*dev, n, MAPPING_MIRROR_TRACK_WRITES, &m) ||
        mapping_mirror_sync_to_gpu(NULL, m))
        _exit(3);
    return m;
}

/* A one-shot handler (SA_RESETHAND) installed before the library that
 * returns without fixing the fault: called once, then the default action
 * kills the process, as without the library (not a loop). */
TEST(tracked_mirror_gives_a_one_shot_handler_one_call_then_the_default_action)
{
    need_tracking();
    CHECK(pipe(chain_pipe) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(20);
        size_t pg = (size_t)sysconf(_SC_PAGESIZE);
        volatile unsigned char *closed = mmap(NULL, pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (closed == MAP_FAILED || segv_install(NULL, one_shot_segv, SA_RESETHAND, NULL) != 0)
            _exit(2);
        mapping_device *dev;
        mapping_mirror *m = child_tracked_mirror(&dev, 16 * pg);
        ((unsigned char *)mapping_mirror_cpu(m))[5] = 1; /* the library's fault (mprotect) */
        if (chain_calls != 0)
            _exit(4);
        closed[0] = 1; /* a genuine crash */
        _exit(5);
    }
    close(chain_pipe[1]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    char buf[64];
    ssize_t calls = read(chain_pipe[0], buf, sizeof buf);
    close(chain_pipe[0]);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
    CHECK(calls == 1);
}

static volatile unsigned char *recovering_page;
static struct sigaction before_reporter;
static volatile sig_atomic_t recovered, reported;

static void recovering_segv(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)ctx;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    if ((uintptr_t)info->si_addr - (uintptr_t)recovering_page >= pg)
        _exit(6);
    recovered++;
    mprotect((void *)recovering_page, pg, PROT_READ | PROT_WRITE);
}

/* A crash reporter installed after the library: it chains to the handler it
 * found (the library's), which chains to the one installed before it. */
static void reporter_segv(int sig, siginfo_t *info, void *ctx)
{
    if (++reported > 100)
        _exit(7); /* the reporter and the library call each other */
    before_reporter.sa_sigaction(sig, info, ctx);
}

TEST(tracked_mirror_leaves_a_handler_installed_after_it_on_top)
{
    need_tracking();
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(20);
        size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = 16 * pg;
        recovering_page = mmap(NULL, pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (recovering_page == MAP_FAILED || segv_install(recovering_segv, NULL, 0, NULL) != 0)
            _exit(2);
        mapping_device *dev;
        mapping_mirror *m = child_tracked_mirror(&dev, n);
        unsigned char *cpu = mapping_mirror_cpu(m);
        cpu[2 * pg] = 1; /* mprotect: the library installs its handler here at the latest */
        if (segv_install(reporter_segv, NULL, 0, &before_reporter) != 0 || !(before_reporter.sa_flags & SA_SIGINFO))
            _exit(2);
        cpu[5 * pg] = 2;
        recovering_page[0] = 7;
        cpu[7 * pg] = 3;
        mprotect((void *)recovering_page, pg, PROT_NONE);
        recovering_page[1] = 8;
        cpu[9 * pg] = 4;
        if (recovered != 2 || recovering_page[0] != 7 || recovering_page[1] != 8)
            _exit(8);
        unsigned char *got = malloc(n);
        if (!got || mapping_mirror_sync_to_gpu(NULL, m) ||
            mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), got, n) ||
            memcmp(got, cpu, n) != 0)
            _exit(9);
        struct sigaction now;
        if (sigaction(SIGSEGV, NULL, &now) != 0 || now.sa_sigaction != reporter_segv)
            _exit(10); /* the reporter is still the installed handler */
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status))
        fprintf(stderr, "child: signal %d\n", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* fork() while another thread starts and ends tracked mirrors (and so holds
 * the tracker's and the handle registries' locks now and then): no child
 * may inherit a lock taken, and the parent must not stall either. Each
 * child tracks a mirror of its own, on a device the other thread does not
 * use (a device's own locks are not taken across fork()). */
static atomic_int churn_stop;

static void *churn_tracked_mirrors(void *arg)
{
    mapping_device *dev = arg;
    while (!atomic_load(&churn_stop)) {
        mapping_mirror *m;
        if (mapping_mirror_create(dev, 16 * page(), MAPPING_MIRROR_TRACK_WRITES, &m) == MAPPING_OK)
            mapping_mirror_destroy(m);
    }
    return NULL;
}

/* A forked child's own tracked mirror, on a device nobody else used: its
 * exit status (a hang ends as SIGALRM). */
static int child_tracks_an_array(mapping_device *dev)
{
    alarm(10);
    size_t pg = page();
    unsigned char *a = aligned_alloc(pg, 4 * pg);
    mapping_mirror *m;
    if (!a || mapping_mirror_wrap(dev, a, 4 * pg, MAPPING_MIRROR_TRACK_WRITES, &m) != MAPPING_OK)
        return 2;
    a[pg] = 1;
    size_t stale = mapping_mirror_stale_bytes(m, MAPPING_GPU);
    mapping_mirror_destroy(m);
    return stale == 4 * pg ? 0 : 3; /* never synced: all of it */
}

/* fork() is not supported with threads under ThreadSanitizer, and
 * AddressSanitizer's allocator is not fork-safe. */
static void skip_under_sanitizers(void)
{
    if (TEST_TSAN)
        test_skip("ThreadSanitizer: fork() in a multi-threaded process is not supported there");
    if (TEST_ASAN)
        test_skip("AddressSanitizer: its allocator is not fork-safe here (a child can wait forever on an allocator lock "
                  "the other thread held at the fork, seen in gcc 12's libasan); the plain build runs this test");
}

TEST(tracked_mirrors_begun_and_ended_by_a_thread_survive_forks_of_another)
{
    need_tracking();
    skip_under_sanitizers();
    mapping_device_desc desc = {.backend = "host"}; /* a driver is not usable in a forked child */
    mapping_device *dev, *busy;
    CHECK_OK(mapping_open(&desc, &dev));
    CHECK_OK(mapping_open(&desc, &busy));
    pthread_t churn;
    atomic_store(&churn_stop, 0);
    CHECK(pthread_create(&churn, NULL, churn_tracked_mirrors, busy) == 0);
    int bad = 0;
    for (int i = 0; i < 200 && !bad; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0)
            _exit(child_tracks_an_array(dev));
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "child %d: %s %d\n", i, WIFEXITED(status) ? "exit" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            bad = 1;
        }
    }
    atomic_store(&churn_stop, 1);
    CHECK(pthread_join(churn, NULL) == 0);
    mapping_close(busy);
    mapping_close(dev);
    CHECK(!bad);
}

/* A fork that begins before another thread's first tracked mirror. glibc
 * (2.36 and later) runs a fork's prepare handlers without holding its
 * atfork lock, and a handler registered meanwhile by another thread is
 * left out of that fork: neither its prepare nor its child handler runs.
 * The library used to register its fork handlers at the first tracked
 * mirror, from whichever thread made it, and took its locks right after:
 * a child forked then could start with the tracker's or the fault log's
 * lock held by a thread it does not have (its first tracked mirror waited
 * forever: the test above, once in CI, "child 1: signal 14"), or with the
 * fault log's and the entry counter's fork flags unset (it read its
 * parent's perf ring, not mapped in the child). Here a prepare handler of
 * the test's own holds the fork until the other thread has made its first
 * tracked mirrors, and lets it go on making more. */
static atomic_int first_armed, first_go, first_made;

static void hold_the_fork_for_first_mirrors(void)
{
    if (!atomic_load(&first_armed))
        return;
    atomic_store(&first_go, 1);
    /* Bounded: where the C library holds its atfork lock here (glibc before
     * 2.36), or the library's own prepare handlers ran already, the other
     * thread waits for this fork and makes none. */
    for (int i = 0; i < 2000 && atomic_load(&first_made) < 3; i++)
        usleep(1000);
}

static void *first_tracked_mirrors(void *arg)
{
    mapping_device *dev = arg;
    while (!atomic_load(&first_go))
        usleep(100);
    while (!atomic_load(&churn_stop)) {
        mapping_mirror *m;
        if (mapping_mirror_create(dev, 16 * page(), MAPPING_MIRROR_TRACK_WRITES, &m) == MAPPING_OK)
            mapping_mirror_destroy(m);
        atomic_fetch_add(&first_made, 1);
    }
    return NULL;
}

TEST(tracked_mirrors_first_begun_by_a_thread_during_a_fork_of_another_work_in_the_child)
{
    need_tracking();
    skip_under_sanitizers();
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev, *busy;
    CHECK_OK(mapping_open(&desc, &dev));
    CHECK_OK(mapping_open(&desc, &busy));
    CHECK(pthread_atfork(hold_the_fork_for_first_mirrors, NULL, NULL) == 0);
    pthread_t other;
    atomic_store(&churn_stop, 0);
    CHECK(pthread_create(&other, NULL, first_tracked_mirrors, busy) == 0);
    atomic_store(&first_armed, 1);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        _exit(child_tracks_an_array(dev));
    atomic_store(&first_armed, 0);
    int made = atomic_load(&first_made); /* while the fork was held */
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    atomic_store(&churn_stop, 1);
    CHECK(pthread_join(other, NULL) == 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "the child: %s %d (the other thread made %d tracked mirrors during the fork)",
                  WIFEXITED(status) ? "exit status" : "signal",
                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), made);
    mapping_close(busy);
    mapping_close(dev);
}

/* Runs in a forked child. uffd: the inherited tracked mirror is not watched
 * there (the watch belongs to the parent), so every page counts written,
 * and the child's copy of the shadow finds the one byte that changed; it
 * must leave the parent's watch alone. mprotect: the child has a copy of
 * the record and of the protections. A mirror of the child's own (on the
 * host back end) is tracked. */
static int forked_child(mapping_mirror *inherited)
{
    if (mapping_mirror_stale_bytes(inherited, MAPPING_GPU) != 1)
        return 2; /* the byte written before the fork */
    /* The host back end: a driver initialised before a fork (PoCL, CUDA)
     * is not usable in the child. */
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    mapping_mirror *m;
    if (mapping_open(&desc, &dev))
        return 6;
    size_t n = 16 * page();
    if (mapping_mirror_create(dev, n, MAPPING_MIRROR_TRACK_WRITES, &m) || mapping_mirror_sync_to_gpu(NULL, m))
        return 3;
    unsigned char *cpu = mapping_mirror_cpu(m);
    cpu[5 * page() + 7] = 0x77;
    if (mapping_mirror_stale_bytes(m, MAPPING_GPU) != 1 || mapping_mirror_sync_to_gpu(NULL, m))
        return 4;
    unsigned char got = 0;
    size_t at = mapping_mirror_gpu_offset(m) + 5 * page() + 7;
    if (mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), at, &got, 1) || got != 0x77)
        return 5;
    mapping_mirror_destroy(m);
    mapping_close(dev);
    return 0;
}

TEST(tracked_mirror_in_a_forked_child_leaves_the_parents_watch_alone)
{
    need_tracking();
    mapping_device *dev = test_device();
    size_t n = 64 * page();
    mapping_mirror *m = synced_tracked_mirror(dev, n);
    unsigned char *cpu = mapping_mirror_cpu(m);
    cpu[3 * page() + 1] = 0x31; /* written before the fork, synced after it */
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        _exit(forked_child(m));
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "the child: %s %d", WIFEXITED(status) ? "exit status" : "signal",
                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 1);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    cpu[40 * page() + 2] = 0x42; /* after the child is gone: the parent's watch still works */
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 1);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    unsigned char *got = malloc(n);
    CHECK(got != NULL);
    device_bytes(m, got);
    CHECK(got[3 * page() + 1] == 0x31 && got[40 * page() + 2] == 0x42);
    free(got);
    mapping_mirror_destroy(m);
}

static void *write_from_a_thread(void *arg)
{
    *(volatile unsigned char *)arg = 0x5C;
    return NULL;
}

TEST(tracked_sync_counts_the_pages_found_and_the_walks)
{
    need_tracking();
    mapping_device *dev = test_device();
    size_t n = 64 * page();
    mapping_mirror *m = synced_tracked_mirror(dev, n);
    unsigned char *cpu = mapping_mirror_cpu(m);
    mapping_device_stats_reset(dev);
    cpu[3 * page()] = 1; /* three isolated pages */
    cpu[20 * page() + 5] = 2;
    cpu[41 * page() + page() - 1] = 3;
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_stats s = test_stats(dev);
    CHECK(s.tracked_pages == 3);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* clean: nothing found (a walk may still run) */
    s = test_stats(dev);
    CHECK(s.tracked_pages == 3);
    uint64_t walks = s.tracking_walks;
    /* A write from another thread: uffd's fault log cannot vouch for it, so
     * the sync walks; mprotect never walks. */
    pthread_t th;
    CHECK(pthread_create(&th, NULL, write_from_a_thread, cpu + 50 * page()) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    s = test_stats(dev);
    CHECK(s.tracked_pages == 4);
    if (mapping_write_tracking(NULL) == MAPPING_TRACK_UFFD)
        CHECK(s.tracking_walks > walks);
    else
        CHECK(s.tracking_walks == 0);
    char json[2048];
    CHECK_OK(mapping_device_stats_json(dev, json, sizeof json, NULL));
    CHECK(strstr(json, "\"tracked_pages\":4") != NULL);
    mapping_mirror_destroy(m);
}

/* ---- the memory's own protection ---- */

/* Whether the kernel may write the byte at p (read(2) from a pipe into it;
 * EFAULT where the page is not writable), without a signal. */
static bool kernel_can_write(unsigned char *p)
{
    int fd[2];
    CHECK(pipe(fd) == 0);
    CHECK(write(fd[1], "x", 1) == 1);
    ssize_t got = read(fd[0], p, 1);
    int err = errno;
    close(fd[0]);
    close(fd[1]);
    CHECK(got == 1 || err == EFAULT);
    return got == 1;
}

static void check_wrap_refused(mapping_device *dev, void *p, size_t n, const char *why)
{
    mapping_mirror *m = NULL;
    CHECK_REFUSED(mapping_mirror_wrap(dev, p, n, MAPPING_MIRROR_TRACK_WRITES, &m), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(m == NULL);
    if (!strstr(mapping_last_error_message(), why))
        test_fail(__FILE__, __LINE__, "message \"%s\" does not say \"%s\"", mapping_last_error_message(), why);
}

static const unsigned char constant_table[3 * 65536] = {1, 2, 3};

/* A tracked wrap takes only memory a sync to the CPU can write: read-only
 * memory (PROT_READ, a const array), a PROT_NONE page inside the range,
 * pages not mapped are refused, and keep their protection (mprotect
 * tracking used to make them read-write when the mirror ended, or at once
 * when it failed). Executable read-write memory stays executable. */
TEST(tracked_wrap_refuses_memory_it_could_not_write_and_keeps_its_protection)
{
    need_tracking();
    mapping_device *dev = test_device();
    size_t pg = page(), n = 4 * pg;
    char perms[5];

    unsigned char *ro = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(ro != MAP_FAILED);
    check_wrap_refused(dev, ro, n, "not readable and writable");
    CHECK(!kernel_can_write(ro + pg));
    CHECK(strcmp(test_page_perms(ro, perms), "r--p") == 0);

    const unsigned char *table = (const unsigned char *)(((uintptr_t)constant_table + pg - 1) & ~(uintptr_t)(pg - 1));
    check_wrap_refused(dev, (void *)(uintptr_t)table, pg, "not readable and writable");
    CHECK(test_page_perms(table, perms)[1] == '-');

    unsigned char *guarded = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(guarded != MAP_FAILED);
    CHECK(mprotect(guarded + 2 * pg, pg, PROT_NONE) == 0);
    check_wrap_refused(dev, guarded, n, "not readable and writable");
    CHECK(strcmp(test_page_perms(guarded + 2 * pg, perms), "---p") == 0);
    CHECK(strcmp(test_page_perms(guarded, perms), "rw-p") == 0);
    guarded[0] = 1; /* still writable, and no handler in the way */

    CHECK(munmap(guarded + 2 * pg, pg) == 0);
    check_wrap_refused(dev, guarded, n, "not mapped");
    CHECK(strcmp(test_page_perms(guarded + 3 * pg, perms), "rw-p") == 0);

    /* Read-write and executable: tracked, and executable again after. */
    unsigned char *rwx = mmap(NULL, n, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (rwx != MAP_FAILED) {
        mapping_mirror *m = NULL;
        CHECK_OK(mapping_mirror_wrap(dev, rwx, n, MAPPING_MIRROR_TRACK_WRITES, &m));
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        CHECK(test_page_perms(rwx + pg, perms)[2] == 'x'); /* while tracked too */
        rwx[pg + 9] = 0x77;
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        unsigned char got = 0;
        CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m) + pg + 9, &got, 1));
        CHECK(got == 0x77);
        mapping_mirror_destroy(m);
        CHECK(strcmp(test_page_perms(rwx + pg, perms), "rwxp") == 0);
        /* Executable in part: mprotect tracking could not keep both. */
        CHECK(mprotect(rwx, pg, PROT_READ | PROT_WRITE) == 0);
        m = NULL;
        mapping_status st = mapping_mirror_wrap(dev, rwx, n, MAPPING_MIRROR_TRACK_WRITES, &m);
        if (mapping_write_tracking(NULL) == MAPPING_TRACK_MPROTECT) {
            CHECK(st == MAPPING_ERR_UNSUPPORTED && m == NULL);
            CHECK(strstr(mapping_last_error_message(), "executable") != NULL);
        } else {
            CHECK(st == MAPPING_OK);
            mapping_mirror_destroy(m);
        }
        CHECK(strcmp(test_page_perms(rwx, perms), "rw-p") == 0 && strcmp(test_page_perms(rwx + pg, perms), "rwxp") == 0);
        munmap(rwx, n);
    }
    munmap(ro, n);
    munmap(guarded, 2 * pg);
}

/* ---- a write through a page another thread's fault opened ---- */

/* Thread A writes page 0's first byte (its fault opens the page); this
 * thread waits until the kernel can write the page's second byte (pread(2)
 * from a file: EFAULT while protected, no signal), which it then does
 * without a fault, and syncs at once. The sync must carry that byte: A's
 * fault opened the page before this thread's write, which comes before the
 * sync. mprotect: the handler made the page writable before it set the
 * page's bit, and a collect between saw no bit. uffd: the kernel counts a
 * fault after it made the page writable, and a collect between saw the old
 * count (and a fault log without the page), and skipped the scan. */
enum { OPENED_ROUNDS = 10000 };
static unsigned char *opened_page;
static atomic_int opened_go, opened_done;

static void *write_on_go(void *arg)
{
    (void)arg;
    for (int seen = 0;;) {
        int g;
        while ((g = atomic_load(&opened_go)) == seen)
            ;
        if (g < 0)
            return NULL;
        seen = g;
        ((volatile unsigned char *)opened_page)[0] = (unsigned char)g;
        atomic_store(&opened_done, g);
    }
}

TEST(tracked_write_through_a_page_another_threads_fault_opened_is_in_the_next_sync)
{
    need_tracking();
    if (TEST_TSAN)
        test_skip("ThreadSanitizer: the writer races the sync on purpose");
    /* mprotect: the handler waits 1 ms between opening the page and
     * setting its bit (a test knob read when the handler is installed, at
     * the first tracked mirror), so every round syncs inside that window.
     * uffd has no such knob: the kernel's window is short, and many rounds
     * catch it now and then. */
    bool delayed = mapping_write_tracking(NULL) == MAPPING_TRACK_MPROTECT;
    if (delayed)
        setenv("MAPPING_TRACK_TEST_OPEN_DELAY_US", "1000", 1);
    int max_rounds = delayed ? 200 : OPENED_ROUNDS;
    mapping_device *dev = test_device();
    size_t pg = page();
    opened_page = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(opened_page != MAP_FAILED);
    mapping_mirror *m = NULL;
    CHECK_OK(mapping_mirror_wrap(dev, opened_page, pg, MAPPING_MIRROR_TRACK_WRITES, &m));
    FILE *values = tmpfile(); /* byte v at offset v: pread, a tight loop */
    CHECK(values != NULL);
    for (int v = 0; v < 256; v++)
        CHECK(fputc(v, values) == v);
    CHECK(fflush(values) == 0);
    int fd = fileno(values);
    atomic_store(&opened_go, 0);
    atomic_store(&opened_done, 0);
    pthread_t writer;
    CHECK(pthread_create(&writer, NULL, write_on_go, NULL) == 0);
    int stale = 0, rounds = 0;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 1; i <= max_rounds; i++, rounds++) {
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* the page is protected again */
        unsigned char v = (unsigned char)(i * 7 + 1), got[2];
        atomic_store(&opened_go, i);
        while (pread(fd, opened_page + 1, 1, v) != 1)
            CHECK(errno == EFAULT);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), got, 2));
        stale += got[1] != v;
        while (atomic_load(&opened_done) != i)
            ;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec) >= 1500000000L)
            break;
    }
    atomic_store(&opened_go, -1);
    CHECK(pthread_join(writer, NULL) == 0);
    if (stale)
        test_fail(__FILE__, __LINE__, "%d of %d syncs missed a write made before them", stale, rounds);
    fclose(values);
    mapping_mirror_destroy(m);
    munmap(opened_page, pg);
}

/* More tracked mirrors than mprotect tracking watches at once: the one too
 * many is refused with a message that says so (it used to read "no write
 * tracking (...; No space left on device)"), and once one is destroyed
 * there is room again. uffd has no such limit. */
TEST(tracked_mirrors_beyond_the_mprotect_table_are_refused_with_a_clear_message)
{
    need_tracking();
    mapping_device *dev = test_device();
    enum { MANY = 300 };
    mapping_mirror **m = calloc(MANY, sizeof *m);
    CHECK(m != NULL);
    int made = 0;
    mapping_status st = MAPPING_OK;
    while (made < MANY && (st = mapping_mirror_create(dev, page(), MAPPING_MIRROR_TRACK_WRITES, &m[made])) == MAPPING_OK)
        made++;
    if (mapping_write_tracking(NULL) == MAPPING_TRACK_MPROTECT) {
        CHECK(made == 256 && st == MAPPING_ERR_UNSUPPORTED && m[made] == NULL);
        CHECK(mapping_last_error() == MAPPING_ERR_UNSUPPORTED);
        CHECK(strstr(mapping_last_error_message(), "256 tracked mirrors exist already") != NULL);
        mapping_mirror_destroy(m[7]);
        CHECK_OK(mapping_mirror_create(dev, page(), MAPPING_MIRROR_TRACK_WRITES, &m[7]));
        ((unsigned char *)mapping_mirror_cpu(m[7]))[3] = 0x42;
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m[7]));
        unsigned char got = 0;
        CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m[7]), mapping_mirror_gpu_offset(m[7]) + 3, &got, 1));
        CHECK(got == 0x42);
    } else {
        CHECK(made == MANY);
    }
    for (int i = 0; i < made; i++)
        mapping_mirror_destroy(m[i]);
    free(m);
}

/* In a child: the mechanism's description, chosen with every descriptor
 * taken (exhaust) or not, written to fd. */
static void describe_in_a_child(int fd, bool exhaust)
{
    if (exhaust) {
        struct rlimit r = {64, 64};
        setrlimit(RLIMIT_NOFILE, &r);
        while (dup(0) >= 0 || errno == EINTR)
            ;
    }
    const char *d = mapping_write_tracking_description();
    ssize_t rc = write(fd, d, strlen(d));
    (void)rc;
    _exit(0);
}

static void child_description(bool exhaust, char *out, size_t cap)
{
    int p[2];
    CHECK(pipe(p) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        describe_in_a_child(p[1], exhaust);
    }
    close(p[1]);
    size_t n = 0;
    for (ssize_t k; n + 1 < cap && (k = read(p[0], out + n, cap - 1 - n)) > 0;)
        n += (size_t)k;
    out[n] = 0;
    close(p[0]);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
}

/* A process out of descriptors when it first tracks cannot open a
 * userfaultfd: it falls back to mprotect, and the description says why in
 * the kernel's words (it used to say only "refused"). */
TEST(tracking_falls_back_to_mprotect_and_says_why_when_descriptors_run_out)
{
    const char *env = getenv("MAPPING_TRACK");
    if (env && *env && strcmp(env, "auto") != 0)
        test_skip("MAPPING_TRACK=%s: the choice is forced", env);
    char normal[512], starved[512];
    child_description(false, normal, sizeof normal);
    if (strncmp(normal, "uffd", 4) != 0)
        test_skip("no uffd tracking here: %s", normal);
    child_description(true, starved, sizeof starved);
    if (strncmp(starved, "mprotect", 8) != 0 || !strstr(starved, "Too many open files"))
        test_fail(__FILE__, __LINE__, "out of descriptors, the description is \"%s\"", starved);
}

/* A fork while another thread is inside the mprotect handler, between
 * opening a page and recording it (held there 200 ms by the test knob):
 * in the child that thread does not exist, but its count did, and the
 * child's first collect waited for it forever. Now the child counts the
 * region written in full once (the shadow then finds the bytes that
 * changed), and tracks it as before. */
static unsigned char *held_page;

static void *write_held_page(void *arg)
{
    (void)arg;
    held_page[9] = 0x21; /* faults; the handler holds 200 ms */
    return NULL;
}

static int child_after_a_held_handler(mapping_mirror *m)
{
    alarm(3); /* a hang ends as SIGALRM */
    size_t stale = mapping_mirror_stale_bytes(m, MAPPING_GPU);
    if (stale < 1 || stale > 2) /* the region counts written in full: the shadow finds pread's byte (and the held write's, if it landed) */
        return 2;
    if (mapping_mirror_sync_to_gpu(NULL, m) || mapping_mirror_stale_bytes(m, MAPPING_GPU) != 0)
        return 3;
    held_page[17] = 0x55; /* protected again, so seen */
    if (mapping_mirror_stale_bytes(m, MAPPING_GPU) != 1)
        return 4;
    return 0;
}

TEST(tracked_mirror_forked_while_a_thread_is_in_the_handler_works_in_the_child)
{
    need_tracking();
    if (mapping_write_tracking(NULL) != MAPPING_TRACK_MPROTECT)
        test_skip("the mprotect handler's case; this process tracks with %s", mapping_write_tracking_description());
    if (strcmp(test_backend(), "host") != 0)
        test_skip("the child syncs: the host back end only (a driver is not usable after a fork)");
    if (TEST_ASAN || TEST_TSAN)
        test_skip("a fork while another thread runs: not under the sanitizers");
    setenv("MAPPING_TRACK_TEST_OPEN_DELAY_US", "200000", 1); /* read at the first tracked mirror */
    mapping_device *dev = test_device();
    size_t n = 8 * page();
    mapping_mirror *m = synced_tracked_mirror(dev, n);
    held_page = (unsigned char *)mapping_mirror_cpu(m) + 2 * page();
    FILE *values = tmpfile();
    CHECK(values != NULL && fputc(0x11, values) == 0x11 && fflush(values) == 0);
    pthread_t writer;
    CHECK(pthread_create(&writer, NULL, write_held_page, NULL) == 0);
    /* The page is writable once the handler has opened it (pread: EFAULT before). */
    while (pread(fileno(values), held_page + 1, 1, 0) != 1)
        CHECK(errno == EFAULT);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        _exit(child_after_a_held_handler(m));
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(pthread_join(writer, NULL) == 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "the child: %s %d", WIFEXITED(status) ? "exit status" : "signal",
                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    /* The parent's watch is whole: both writes made before this sync go up. */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    unsigned char *got = malloc(n);
    CHECK(got != NULL);
    device_bytes(m, got);
    CHECK(got[2 * page() + 9] == 0x21 && got[2 * page() + 1] == 0x11);
    free(got);
    fclose(values);
    mapping_mirror_destroy(m);
}
