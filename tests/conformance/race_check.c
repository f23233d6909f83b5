/*
 * MAPPING_CHECK=races: a CPU access to host memory that an asynchronous
 * copy is using stops the program with a report naming the address, the
 * copy and the stream. Each planted race runs in a child process (fork):
 * the child must die of SIGABRT with the report on stderr; a child that
 * survives the race exits 0, and the test fails. The copy is held in its
 * queue by a host function that waits on a flag nobody sets in time.
 */
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"

enum { BYTES = 16 * 4096 };

static _Atomic int release_gate;

static void gate(void *user)
{
    (void)user;
    while (!atomic_load(&release_gate))
        usleep(1000);
}

/* Runs in the child: opens its own device (threads do not survive fork),
 * queues the copy behind the gate, then touches the middle of the range. */
static int child(int to_gpu, int by_device_flag)
{
    if (by_device_flag)
        unsetenv("MAPPING_CHECK");
    else
        setenv("MAPPING_CHECK", "races", 1);
    mapping_device_desc desc = {.backend = test_backend()};
    mapping_device *dev;
    mapping_stream *s;
    mapping_buffer *buf;
    if (mapping_open(&desc, &dev))
        return TEST_SKIP_CODE; /* the back end is absent */
    if (by_device_flag && (mapping_device_set_checks(dev, MAPPING_DEVICE_CHECK_RACES) ||
                           mapping_device_checks(dev) != MAPPING_DEVICE_CHECK_RACES))
        return 3;
    if (mapping_stream_create(dev, &s) || mapping_allocate_gpu(dev, BYTES, &buf))
        return 3;
    volatile unsigned char *host = aligned_alloc(4096, BYTES);
    if (!host)
        return 3;
    memset((void *)host, 1, BYTES);
    if (mapping_launch_host(s, gate, NULL))
        return 3;
    mapping_status st = to_gpu ? mapping_sync_to_gpu_range(s, (const void *)host, buf, 0, BYTES)
                               : mapping_sync_to_cpu_range(s, buf, 0, (void *)host, BYTES);
    if (st)
        return 3;
    if (to_gpu)
        host[5 * 4096 + 17] = 2; /* the planted write */
    else
        (void)host[5 * 4096 + 17]; /* the planted read */
    atomic_store(&release_gate, 1);
    mapping_stream_synchronize(s);
    return 0; /* not caught */
}

static void expect_caught_by(int to_gpu, int by_device_flag, const char *what)
{
    int err[2];
    CHECK(pipe(err) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(err[1], 2);
        close(err[0]);
        _exit(child(to_gpu, by_device_flag));
    }
    close(err[1]);
    char out[4096] = {0};
    size_t n = 0;
    for (ssize_t k; n + 1 < sizeof out && (k = read(err[0], out + n, sizeof out - 1 - n)) > 0;)
        n += (size_t)k;
    close(err[0]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP_CODE)
        test_skip("back end %s is absent", test_backend());
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
        test_fail(__FILE__, __LINE__, "the child was not stopped by the check (%s %d); its stderr: %s",
                  WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                  out);
    CHECK(strstr(out, "MAPPING_CHECK=races") != NULL);
    CHECK(strstr(out, what) != NULL);
    CHECK(strstr(out, "queued on stream 0x") != NULL);
    printf("%s", out);
}

static void expect_caught(int to_gpu, const char *what)
{
    expect_caught_by(to_gpu, 0, what);
}

TEST(race_check_catches_a_write_during_an_async_upload)
{
    expect_caught(1, "CPU write at 0x");
    expect_caught(1, "raced an asynchronous host-to-device copy");
}

TEST(race_check_catches_a_read_during_an_async_download)
{
    expect_caught(0, "raced an asynchronous device-to-host copy");
}

/* With the check on, access after the stream has passed the copies is fine,
 * and the bytes are right (no false report, nothing left protected). */
TEST(race_check_allows_access_once_the_stream_has_passed)
{
    setenv("MAPPING_CHECK", "races", 1);
    mapping_device *dev = test_device();
    mapping_stream *s;
    mapping_buffer *buf;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_allocate_gpu(dev, BYTES, &buf));
    unsigned char *host = aligned_alloc(4096, BYTES), *back = aligned_alloc(4096, BYTES);
    CHECK(host && back);
    for (int round = 0; round < 20; round++) {
        memset(host, round, BYTES);
        CHECK_OK(mapping_sync_to_gpu_range(s, host + round, buf, 0, BYTES - 64));
        CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, back, BYTES - 64));
        CHECK_OK(mapping_stream_synchronize(s));
        CHECK_BYTES(back, host + round, BYTES - 64);
        back[7 * 4096] ^= 1; /* writable again */
        host[7 * 4096] ^= 1;
    }
    free(host);
    free(back);
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
}

/* A copy into part of a page, queued behind a long copy, then a copy over
 * whole pages that include that page, on the same stream: the later copy's
 * guard must not protect the page before the earlier copy has written it
 * (a driver that copies with CPU stores on its own thread, as PoCL does,
 * would trip over it: a false report). The same with mirror views. */
TEST(race_check_does_not_protect_a_page_an_earlier_queued_copy_still_writes)
{
    setenv("MAPPING_CHECK", "races", 1);
    mapping_device *dev = test_device();
    size_t pg = 4096, big = (size_t)16 << 20;
    mapping_stream *s;
    mapping_buffer *buf;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_allocate_gpu(dev, big, &buf));
    CHECK_OK(mapping_fill_gpu(NULL, buf, 0, big, 0x5c));
    unsigned char *busy = malloc(big), *host = aligned_alloc(pg, 4 * pg);
    CHECK(busy && host);
    for (int round = 0; round < 10; round++) {
        memset(host, 0, 4 * pg);
        CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, busy, big)); /* keeps the stream busy */
        CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, host + 100, 200)); /* inside page 0 */
        CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, host, 3 * pg)); /* pages 0-2 */
        CHECK_OK(mapping_stream_synchronize(s));
        CHECK(host[100] == 0x5c && host[3 * pg - 1] == 0x5c && host[3 * pg] == 0);
    }
    mapping_mirror *m, *v;
    CHECK_OK(mapping_mirror_create(dev, 8 * pg, 0, &m));
    CHECK_OK(mapping_mirror_view(m, 100, 200, &v));
    for (int round = 0; round < 10; round++) {
        CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), 0, 8 * pg, (unsigned char)(round + 1)));
        CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, 8 * pg));
        CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, busy, big));
        CHECK_OK(mapping_mirror_sync_to_cpu(s, v));
        CHECK_OK(mapping_mirror_sync_to_cpu(s, m));
        CHECK_OK(mapping_stream_synchronize(s));
        CHECK(((unsigned char *)mapping_mirror_cpu(m))[150] == round + 1);
    }
    mapping_mirror_destroy(v);
    mapping_mirror_destroy(m);
    free(busy);
    free(host);
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
}

/* The device flag does what the environment does, for its device only. */
TEST(race_check_as_a_device_flag_catches_a_planted_write_and_read)
{
    expect_caught_by(1, 1, "raced an asynchronous host-to-device copy");
    expect_caught_by(0, 1, "raced an asynchronous device-to-host copy");
}

TEST(race_check_device_flag_refuses_unknown_bits_and_bad_devices)
{
    mapping_device *dev = test_device();
    CHECK(mapping_device_checks(dev) == 0);
    CHECK_REFUSED(mapping_device_set_checks(dev, 1u << 7), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(mapping_device_checks(dev) == 0); /* unchanged */
    CHECK_REFUSED(mapping_device_set_checks(NULL, MAPPING_DEVICE_CHECK_RACES), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(mapping_device_checks(NULL) == 0);
    CHECK_OK(mapping_device_set_checks(dev, MAPPING_DEVICE_CHECK_RACES));
    CHECK(mapping_device_checks(dev) == MAPPING_DEVICE_CHECK_RACES);
    CHECK_OK(mapping_device_set_checks(dev, 0));
    CHECK(mapping_device_checks(dev) == 0);
}

/* An asynchronous upload from read-only memory (a const table) or from
 * executable memory (a JIT buffer) leaves its protection as it was: the
 * checker's guard used to end with the pages read-write (the table
 * writable, the code no longer executable). */
TEST(race_check_keeps_the_protection_of_read_only_and_executable_sources)
{
    setenv("MAPPING_CHECK", "races", 1);
    mapping_device *dev = test_device();
    mapping_stream *s;
    mapping_buffer *buf;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_allocate_gpu(dev, BYTES, &buf));
    static const int prots[] = {PROT_READ, PROT_READ | PROT_WRITE | PROT_EXEC, PROT_READ | PROT_EXEC};
    static const char *const perms[] = {"r--p", "rwxp", "r-xp"};
    unsigned char *back = aligned_alloc(4096, BYTES);
    CHECK(back != NULL);
    for (int k = 0; k < 3; k++) {
        unsigned char *src = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(src != MAP_FAILED);
        memset(src, 0x30 + k, BYTES);
        if (mprotect(src, BYTES, prots[k]) != 0) {
            munmap(src, BYTES); /* W^X policies may refuse executable memory */
            continue;
        }
        CHECK_OK(mapping_sync_to_gpu_range(s, src, buf, 0, BYTES));
        CHECK_OK(mapping_stream_synchronize(s));
        char now[5];
        for (size_t at = 0; at < BYTES; at += 4096)
            if (strcmp(test_page_perms(src + at, now), perms[k]) != 0)
                test_fail(__FILE__, __LINE__, "page %zu is %s after the upload, was %s", at / 4096, now, perms[k]);
        CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, 0, back, BYTES));
        CHECK_BYTES(back, src, BYTES);
        munmap(src, BYTES);
    }
    free(back);
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
}
