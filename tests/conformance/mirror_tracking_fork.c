/*
 * fork() and the process-wide state of the library's page protection: the
 * race checker's guards (MAPPING_CHECK=races, mapping_device_set_checks)
 * here; write tracking's own fork tests are in mirror_tracking.c. A child
 * has one thread, the one that forked: it must neither wait for a lock that
 * another thread of its parent held at the fork, nor keep protections that
 * only the parent's queued copies (which the child does not have) would
 * ever lift. Every child runs on the host back end (a driver initialised
 * before a fork is not usable in the child) under alarm(), so that a hang
 * ends as SIGALRM.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"

enum { FORK_BYTES = 16 * 4096 };

static void skip_with_sanitizers(void)
{
    if (TEST_TSAN)
        test_skip("ThreadSanitizer: fork() in a multi-threaded process is not supported there");
    if (TEST_ASAN)
        test_skip("AddressSanitizer: its allocator is not fork-safe (a child can wait forever on an allocator lock "
                  "another thread held at the fork); the plain build runs this test");
}

/* A host device with the race check on (whatever $MAPPING_CHECK says). */
static mapping_device *checked_host_device(void)
{
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    if (mapping_open(&desc, &dev) != MAPPING_OK)
        return NULL;
    if (mapping_device_set_checks(dev, MAPPING_DEVICE_CHECK_RACES) != MAPPING_OK) {
        mapping_close(dev);
        return NULL;
    }
    return dev;
}

static void expect_exit_0(pid_t pid, const char *what)
{
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "%s: %s %d", what, WIFEXITED(status) ? "exit status" : "signal",
                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

static _Atomic int fork_gate_open;

static void fork_gate(void *user)
{
    (void)user;
    while (!atomic_load(&fork_gate_open))
        usleep(1000);
}

/* Copies queued (and held) when the parent forks: the source of an upload
 * is read-only and the destination of a download inaccessible until their
 * copies get there, which never happens in the child (it has none of the
 * parent's streams). The child's accesses to that memory race nothing; it
 * was stopped with a report of a race with a copy it does not have. */
TEST(race_check_guards_of_copies_queued_before_a_fork_are_lifted_in_the_child)
{
    skip_with_sanitizers();
    mapping_device *dev = checked_host_device();
    CHECK(dev != NULL);
    mapping_stream *s;
    mapping_buffer *buf;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_allocate_gpu(dev, FORK_BYTES, &buf));
    unsigned char *up = aligned_alloc(4096, FORK_BYTES), *down = aligned_alloc(4096, FORK_BYTES);
    CHECK(up && down);
    memset(up, 1, FORK_BYTES);
    memset(down, 2, FORK_BYTES);
    atomic_store(&fork_gate_open, 0);
    CHECK_OK(mapping_launch_host(s, fork_gate, NULL));
    CHECK_OK(mapping_sync_to_gpu_range(s, up, buf, 0, FORK_BYTES));
    CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, down, FORK_BYTES)); /* brings up's bytes back */
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(10);
        volatile unsigned char *u = up, *d = down;
        u[5 * 4096 + 1] = 7;                  /* read-only in the parent */
        unsigned char seen = d[6 * 4096 + 3]; /* inaccessible in the parent */
        d[6 * 4096 + 3] = 9;
        _exit(seen == 2 && u[5 * 4096 + 1] == 7 && d[6 * 4096 + 3] == 9 ? 0 : 2);
    }
    expect_exit_0(pid, "the child");
    atomic_store(&fork_gate_open, 1);
    CHECK_OK(mapping_stream_synchronize(s));
    up[5 * 4096 + 1] = 8; /* and in the parent, once the stream has passed the copies */
    CHECK(down[6 * 4096 + 3] == 1);
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
    mapping_close(dev);
    free(up);
    free(down);
}

/* fork() while another thread queues checked copies and its stream ends
 * their guards: the guards' lock (and a change of protection half done)
 * must not be inherited taken by a thread the child does not have, whose
 * first checked copy would then wait forever. */
static _Atomic int copier_stop;

static void *checked_copies(void *arg)
{
    mapping_device *dev = arg;
    mapping_stream *s;
    mapping_buffer *buf;
    unsigned char *host = aligned_alloc(4096, FORK_BYTES);
    if (!host || mapping_stream_create(dev, &s) || mapping_allocate_gpu(dev, FORK_BYTES, &buf))
        return (void *)1;
    memset(host, 3, FORK_BYTES);
    while (!atomic_load(&copier_stop)) {
        if (mapping_sync_to_gpu_range(s, host, buf, 0, FORK_BYTES) ||
            mapping_sync_to_cpu_range(s, buf, 0, host, FORK_BYTES) || mapping_stream_synchronize(s))
            return (void *)2;
    }
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
    free(host);
    return NULL;
}

static int child_checks_a_copy(void)
{
    alarm(10);
    mapping_device *dev = checked_host_device();
    mapping_stream *s;
    mapping_buffer *buf;
    unsigned char *host = aligned_alloc(4096, FORK_BYTES), *back = aligned_alloc(4096, FORK_BYTES);
    if (!dev || !host || !back || mapping_stream_create(dev, &s) || mapping_allocate_gpu(dev, FORK_BYTES, &buf))
        return 2;
    memset(host, 4, FORK_BYTES);
    if (mapping_sync_to_gpu_range(s, host, buf, 0, FORK_BYTES) ||
        mapping_sync_to_cpu_range(s, buf, 0, back, FORK_BYTES) || mapping_stream_synchronize(s))
        return 3;
    return memcmp(host, back, FORK_BYTES) == 0 ? 0 : 4;
}

TEST(race_check_survives_forks_while_another_thread_checks_copies)
{
    skip_with_sanitizers();
    mapping_device *busy = checked_host_device();
    CHECK(busy != NULL);
    pthread_t copier;
    atomic_store(&copier_stop, 0);
    CHECK(pthread_create(&copier, NULL, checked_copies, busy) == 0);
    int bad = 0;
    for (int i = 0; i < 100 && !bad; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0)
            _exit(child_checks_a_copy());
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "child %d: %s %d\n", i, WIFEXITED(status) ? "exit" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            bad = 1;
        }
    }
    atomic_store(&copier_stop, 1);
    void *rc;
    CHECK(pthread_join(copier, &rc) == 0);
    CHECK(rc == NULL);
    mapping_close(busy);
    CHECK(!bad);
}
