/* mapping_os_copy_parallel (os/copy_pool.c): a large memcpy shared by helper
 * threads. Equal to memcpy for sizes around its thresholds and any
 * alignment, with 0, 1 and 3 helpers; from several threads at once; the
 * helpers exist only when asked for; a forked child copies with helpers of
 * its own; $MAPPING_COPY_THREADS is read strictly. */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "os/os.h"

enum { GUARD = 64 };

static void fill_pattern(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 131u + seed * 7u + (i >> 12) + (i >> 20));
}

static void use_helpers(const char *count)
{
    mapping_os_copy_threads_set(atoi(count));
    CHECK(mapping_os_copy_threads() == atoi(count));
}

/* One copy of `bytes` at the misalignments given, checked byte for byte
 * with the guard bytes around the destination untouched. 0 when equal. */
static int copy_and_check(size_t bytes, size_t src_off, size_t dst_off, unsigned seed)
{
    unsigned char *src = malloc(bytes + src_off), *dst = malloc(bytes + dst_off + 2 * GUARD);
    if (!src || !dst) {
        free(src);
        free(dst);
        return -1;
    }
    fill_pattern(src, bytes + src_off, seed);
    memset(dst, 0xA5, bytes + dst_off + 2 * GUARD);
    mapping_os_copy_parallel(dst + GUARD + dst_off, src + src_off, bytes);
    int bad = memcmp(dst + GUARD + dst_off, src + src_off, bytes) != 0;
    for (size_t i = 0; i < GUARD + dst_off; i++)
        bad |= dst[i] != 0xA5;
    for (size_t i = GUARD + dst_off + bytes; i < bytes + dst_off + 2 * GUARD; i++)
        bad |= dst[i] != 0xA5;
    free(src);
    free(dst);
    return bad;
}

UNIT_TEST(parallel_copy_equals_memcpy_for_sizes_around_its_thresholds_with_any_helper_count)
{
    static const size_t sizes[] = {0, 1, 4096, ((size_t)2 << 20) - 1, (size_t)2 << 20, ((size_t)2 << 20) + 1,
                                   ((size_t)3 << 20) + 77, ((size_t)4 << 20) - 64, ((size_t)17 << 20) + 5};
    static const char *const helpers[] = {"0", "1", "3"};
    for (size_t h = 0; h < sizeof helpers / sizeof helpers[0]; h++) {
        use_helpers(helpers[h]);
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (size_t a = 0; a < 3; a++)
                if (copy_and_check(sizes[s], a * 5, a * 3 + (s & 1), (unsigned)(h * 100 + s)) != 0)
                    test_fail(__FILE__, __LINE__, "%s helpers, %zu bytes, src +%zu, dst +%zu: not what memcpy gives",
                              helpers[h], sizes[s], a * 5, a * 3 + (s & 1));
    }
    mapping_os_copy_threads_set(mapping_os_copy_threads_default());
}

typedef struct copier {
    unsigned seed;
    int      failures;
} copier;

static void *copy_many(void *arg)
{
    copier *c = arg;
    for (int i = 0; i < 12; i++)
        c->failures += copy_and_check(((size_t)5 << 20) + (size_t)i * 4099, (size_t)i % 7, (size_t)i % 5,
                                      c->seed + (unsigned)i) != 0;
    return NULL;
}

UNIT_TEST(parallel_copies_from_several_threads_at_once_each_land_whole)
{
    use_helpers("2");
    enum { THREADS = 4 };
    pthread_t t[THREADS];
    copier c[THREADS];
    for (int i = 0; i < THREADS; i++) {
        c[i] = (copier){.seed = (unsigned)(i * 1000)};
        CHECK(pthread_create(&t[i], NULL, copy_many, &c[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK(c[i].failures == 0);
    }
    mapping_os_copy_threads_set(mapping_os_copy_threads_default());
}

static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Runs in a fresh process (fork), so the helpers counted are this test's. */
UNIT_TEST(parallel_copy_makes_helpers_only_when_asked_and_a_forked_child_makes_its_own)
{
    if (thread_count() < 0)
        test_skip("no /proc/self/task to count threads in");
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(60); /* a hang fails the test, never blocks it */
        int before = thread_count();
        use_helpers("0");
        int bad = copy_and_check((size_t)8 << 20, 1, 2, 7) != 0;
        bad |= (thread_count() != before) << 1; /* no helper made for 0 */
        use_helpers("3");
        bad |= (copy_and_check((size_t)8 << 20, 3, 0, 8) != 0) << 2;
        int with_helpers = thread_count(); /* a sanitizer's runtime may add a thread of its own */
        bad |= (with_helpers < before + 3 || with_helpers > before + 4) << 3;
        bad |= (copy_and_check((size_t)9 << 20, 0, 1, 9) != 0) << 2;
        bad |= (thread_count() != with_helpers) << 3; /* made once */
#if !TEST_TSAN /* ThreadSanitizer refuses new threads after a fork of a process with threads */
        fflush(NULL);
        pid_t grandchild = fork(); /* the helpers are not in it: it makes its own */
        if (grandchild == 0) {
            int b = copy_and_check((size_t)8 << 20, 2, 2, 10) != 0;
            b |= (thread_count() != 1 + 3) << 1;
            _exit(b);
        }
        int status = 0;
        bad |= (grandchild < 0 || waitpid(grandchild, &status, 0) != grandchild || !WIFEXITED(status) ||
                WEXITSTATUS(status) != 0)
               << 4;
#endif
        _exit(bad);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status))
        test_fail(__FILE__, __LINE__, "the child died of signal %d (SIGALRM: a copy hung)", WTERMSIG(status));
    CHECK(WIFEXITED(status));
    int bad = WEXITSTATUS(status);
    if (bad)
        test_fail(__FILE__, __LINE__,
                  "child: %s%s%s%s%s", bad & 1 ? "a copy with 0 helpers was wrong; " : "",
                  bad & 2 ? "0 helpers made threads; " : "", bad & 4 ? "a copy with 3 helpers was wrong; " : "",
                  bad & 8 ? "3 helpers did not make exactly 3 threads; " : "",
                  bad & 16 ? "a forked grandchild's copy was wrong, hung or made other than 3 helpers" : "");
}

UNIT_TEST(copy_threads_variable_is_read_strictly)
{
    static const char *const bad[] = {"-1", "65", "1e1", " 2", "2 ", "0x2", "two", "+2", "99999999999999999999"};
    int n;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("MAPPING_COPY_THREADS", bad[i], 1);
        if (mapping_os_copy_threads_from_env(&n))
            test_fail(__FILE__, __LINE__, "MAPPING_COPY_THREADS=\"%s\" was taken as %d", bad[i], n);
        CHECK(n == mapping_os_copy_threads_default());
    }
    static const char *const good[] = {"0", "1", "64", "3"};
    static const int values[] = {0, 1, 64, 3};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        setenv("MAPPING_COPY_THREADS", good[i], 1);
        CHECK(mapping_os_copy_threads_from_env(&n) && n == values[i]);
    }
    setenv("MAPPING_COPY_THREADS", "", 1);
    CHECK(mapping_os_copy_threads_from_env(&n) && n == mapping_os_copy_threads_default());
    unsetenv("MAPPING_COPY_THREADS");
    CHECK(mapping_os_copy_threads_from_env(&n) && n == mapping_os_copy_threads_default());
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    CHECK(mapping_os_copy_threads_default() >= 0 && mapping_os_copy_threads_default() <= 5);
    if (cpus <= 3)
        CHECK(mapping_os_copy_threads_default() == 0); /* no helper where the cores are few */
}
