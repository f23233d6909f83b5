/*
 * The host back end after fork(): a stream runs its work on a worker
 * thread, which a child does not have. A stream (or an event not yet
 * complete) made before the fork is refused in the child with a clear
 * status instead of waiting for ever, and destroying it or closing the
 * device returns (it used to join the missing thread: the child hung).
 * New streams in the child work.
 */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"

static volatile int held, release;

/* Holds the stream's worker (quiet: no lock of its own, no allocation)
 * until the parent's child is done. */
static void hold_stream(void *user)
{
    (void)user;
    held = 1;
    while (!release)
        usleep(100);
}

TEST(a_host_stream_made_before_fork_is_refused_in_the_child_and_destroyed_without_hanging)
{
    if (TEST_TSAN)
        test_skip("ThreadSanitizer: fork() in a process with threads");
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 64, &buf));
    unsigned char host[64], back[64];
    memset(host, 0x5a, sizeof host);
    CHECK_OK(mapping_sync_to_gpu_range(s, host, buf, 0, sizeof host));
    CHECK_OK(mapping_stream_synchronize(s));
    /* An event the parent's stream has not reached at the fork. */
    CHECK_OK(mapping_launch_host(s, hold_stream, NULL));
    mapping_event *pending;
    CHECK_OK(mapping_event_record(s, &pending));
    while (!held) /* the worker sits in the function: it holds nothing at the fork */
        usleep(100);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        alarm(20); /* a hang fails the test, not the suite */
        int bad = 0;
        bad |= mapping_stream_synchronize(s) != MAPPING_ERR_INVALID_HANDLE;
        bad |= strstr(mapping_last_error_message(), "fork()") == NULL;
        bad |= mapping_sync_to_gpu_range(s, host, buf, 0, sizeof host) != MAPPING_ERR_INVALID_HANDLE;
        bad |= mapping_event_synchronize(pending) != MAPPING_ERR_INVALID_HANDLE;
        mapping_stream *fresh;
        bad |= mapping_stream_create(dev, &fresh) != MAPPING_OK;
        bad |= mapping_stream_wait_event(fresh, pending) != MAPPING_ERR_INVALID_HANDLE;
        memset(back, 0, sizeof back);
        bad |= mapping_sync_to_cpu_range(fresh, buf, 0, back, sizeof back) != MAPPING_OK;
        bad |= mapping_stream_synchronize(fresh) != MAPPING_OK;
        bad |= memcmp(back, host, sizeof host) != 0;
        mapping_stream_destroy(fresh);
        mapping_stream_destroy(s); /* hung here */
        mapping_event_destroy(pending);
        mapping_free_gpu(buf);
        mapping_close(dev);
        _exit(bad ? 1 : 0);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    release = 1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "the child %s %d", WIFEXITED(status) ? "exited with" : "died of signal",
                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    CHECK_OK(mapping_event_synchronize(pending));
    CHECK_OK(mapping_stream_synchronize(s));
    mapping_event_destroy(pending);
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
}
