/* The trace's start and stop under pressure: two threads starting at once
 * (exactly one records), a disk that fills while the trace is written (an
 * I/O status naming errno, and the file that was there left whole), and a
 * device path (/dev/full) written in place, never replaced. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"

typedef struct racer {
    pthread_barrier_t *start;
    const char        *path;
    mapping_status     status;
} racer;

static void *race_to_start(void *arg)
{
    racer *r = arg;
    pthread_barrier_wait(r->start);
    r->status = mapping_trace_start(r->path);
    return NULL;
}

TEST(trace_start_from_two_threads_at_once_records_exactly_one_trace)
{
    test_device();
    char dir[] = "/tmp/mapping-trace-race-XXXXXX", path[2][128];
    CHECK(mkdtemp(dir) != NULL);
    for (int i = 0; i < 2; i++)
        snprintf(path[i], sizeof path[i], "%s/trace%d.json", dir, i);
    /* Before: both got MAPPING_OK in most rounds, and one trace was lost. */
    for (int round = 0; round < 200; round++) {
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, 2);
        racer r[2] = {{&start, path[0], MAPPING_OK}, {&start, path[1], MAPPING_OK}};
        pthread_t t[2];
        for (int i = 0; i < 2; i++)
            CHECK(pthread_create(&t[i], NULL, race_to_start, &r[i]) == 0);
        for (int i = 0; i < 2; i++)
            pthread_join(t[i], NULL);
        pthread_barrier_destroy(&start);
        int won = (r[0].status == MAPPING_OK) + (r[1].status == MAPPING_OK);
        if (won != 1 || (r[0].status != MAPPING_ERR_BUSY && r[1].status != MAPPING_ERR_BUSY))
            test_fail(__FILE__, __LINE__, "round %d: the starts returned %s and %s", round,
                      mapping_status_name(r[0].status), mapping_status_name(r[1].status));
        CHECK(mapping_trace_active());
        CHECK_OK(mapping_trace_stop());
        const char *winner = r[0].status == MAPPING_OK ? path[0] : path[1];
        struct stat st;
        CHECK(stat(winner, &st) == 0 && st.st_size > 0);
        remove(path[0]);
        remove(path[1]);
    }
    CHECK(rmdir(dir) == 0); /* and no temporary file was left behind */
}

/* Enough traced work to make a trace of some kilobytes. */
static void traced_work(mapping_device *dev)
{
    mapping_buffer *buf;
    char host[64] = {1};
    CHECK_OK(mapping_allocate_gpu(dev, sizeof host, &buf));
    for (int i = 0; i < 200; i++)
        CHECK_OK(mapping_sync_to_gpu_range(NULL, host, buf, 0, sizeof host));
    mapping_free_gpu(buf);
}

static long file_bytes(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

TEST(trace_stop_on_a_full_disk_returns_an_io_status_naming_errno_and_keeps_the_old_file)
{
    char dir[] = "/tmp/mapping-trace-full-XXXXXX", path[128];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("{\"traceEvents\":[]}\n", f); /* an earlier trace, whole */
    CHECK(fclose(f) == 0);
    long before = file_bytes(path);

    /* A file size limit of 4 KiB stands for the full disk: in a child, with
     * SIGXFSZ ignored, a write past it fails with EFBIG. (The child opens
     * the device: driver threads do not survive a fork.) */
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit limit = {4096, 4096};
        CHECK(setrlimit(RLIMIT_FSIZE, &limit) == 0);
        CHECK_OK(mapping_trace_start(path));
        traced_work(test_device());
        mapping_clear_last_error();
        mapping_status st = mapping_trace_stop();
        if (st != MAPPING_ERR_IO)
            test_fail(__FILE__, __LINE__, "mapping_trace_stop on a full disk returned %s: %s", mapping_status_name(st),
                      mapping_last_error_message());
        CHECK(mapping_last_error() == MAPPING_ERR_IO);
        CHECK(strstr(mapping_last_error_message(), strerror(EFBIG)) != NULL);
        CHECK(strstr(mapping_last_error_message(), path) != NULL);
        CHECK(!mapping_trace_active());
        exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP_CODE)
        exit(TEST_SKIP_CODE); /* the child said why */
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "the child tracing onto a full disk failed (status 0x%x)", status);
    /* The earlier trace is still there, whole; nothing else is. */
    CHECK(file_bytes(path) == before);
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));)
        entries += e->d_name[0] != '.';
    closedir(d);
    CHECK(entries == 1);
    remove(path);
    CHECK(rmdir(dir) == 0);

    /* A device is written in place (never renamed over): /dev/full says ENOSPC. */
    mapping_device *dev = test_device();
    struct stat st;
    if (stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode)) {
        CHECK_OK(mapping_trace_start("/dev/full"));
        traced_work(dev);
        CHECK_REFUSED(mapping_trace_stop(), MAPPING_ERR_IO);
        CHECK(strstr(mapping_last_error_message(), strerror(ENOSPC)) != NULL);
        CHECK(stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode));
    }
    CHECK_OK(mapping_trace_stop()); /* not tracing */
}
