/* A flush that runs out of memory while planning names the first copy not
 * done (copy 0), as the header promises for every failed flush, and keeps
 * every copy queued. Memory is made short with RLIMIT_AS in a child
 * process, which sanitizer builds (with their huge shadow mappings) cannot
 * do: there the test is skipped. */
#include <stdint.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"

/* Any sanitizer (MemorySanitizer too): their shadow memory is virtual
 * memory RLIMIT_AS counts. */
#if TEST_ASAN || TEST_TSAN
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(memory_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif

#ifndef UNDER_SANITIZER
static size_t virtual_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (!f || fscanf(f, "%lu", &pages) != 1)
        test_skip("cannot read /proc/self/statm");
    fclose(f);
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

static int child(void)
{
    enum { COPIES = 1 << 20 };
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    mapping_buffer *buf;
    mapping_batch *b;
    static unsigned char host[64];
    mapping_link link = {5e-6, 25e9}; /* no measuring (it allocates) */
    if (mapping_open(&desc, &dev) || mapping_device_set_link(dev, &link) || mapping_allocate_gpu(dev, 1 << 20, &buf) ||
        mapping_batch_create(dev, &b))
        return 10;
    for (size_t i = 0; i < COPIES; i++)
        if (mapping_batch_add_to_gpu(b, host, buf, (i * 64) % (1 << 20), 64))
            return 11;
    /* The plan needs several arrays of COPIES entries: leave room for none. */
    struct rlimit lim = {virtual_bytes() + (4 << 20), RLIM_INFINITY};
    lim.rlim_max = lim.rlim_cur;
    if (setrlimit(RLIMIT_AS, &lim))
        return 12;
    mapping_status st = mapping_batch_flush(NULL, b);
    const char *msg = mapping_last_error_message();
    printf("flush: %s: %s\n", mapping_status_name(st), msg);
    fflush(stdout);
    if (st != MAPPING_ERR_OUT_OF_HOST_MEMORY)
        return 13;
    if (!strstr(msg, "copy 0 of 1048576") || !strstr(msg, "host-to-device") || !strstr(msg, "was not done"))
        return 14;
    if (mapping_batch_count(b) != COPIES)
        return 15;
    return 0;
}

#endif

UNIT_TEST(a_flush_out_of_memory_while_planning_names_the_first_copy)
{
#ifdef UNDER_SANITIZER
    test_skip("RLIMIT_AS cannot limit a sanitizer build's memory");
#else
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        _exit(child());
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "the child failed (exit %d, signal %d): see its output above",
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
#endif
}
