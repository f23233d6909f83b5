/* The trace's start and stop under pressure: two threads starting at once
 * (exactly one records), a disk that fills while the trace is written (an
 * I/O status naming errno, and the file that was there left whole), and a
 * device path (/dev/full) written in place, never replaced. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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

static bool is_trace_json(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char head[512] = {0}, tail[8] = {0};
    size_t n = fread(head, 1, sizeof head - 1, f);
    fseek(f, -3, SEEK_END);
    size_t m = fread(tail, 1, 3, f);
    fclose(f);
    return n > 0 && m == 3 && strncmp(head, "{", 1) == 0 && strstr(head, "traceEvents") && strcmp(tail, "]}\n") == 0;
}

/* Where the trace goes: through a link to a file, the file is replaced and
 * the link kept; a FIFO is written once, in place, by one descriptor opened
 * at start (its reader gets the whole trace), and a FIFO with no reader
 * fails the start at once instead of blocking; a forked child's exit never
 * writes its copy of the parent's recording over the parent's. */
TEST(trace_follows_links_writes_fifos_in_place_and_is_the_parents_after_fork)
{
    mapping_device *dev = test_device();
    char dir[] = "/tmp/mapping-trace-where-XXXXXX", real[160], link_path[160], fifo[160], out[160];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(real, sizeof real, "%s/real.json", dir);
    snprintf(link_path, sizeof link_path, "%s/link.json", dir);
    FILE *f = fopen(real, "w");
    CHECK(f && fputs("old", f) >= 0 && fclose(f) == 0);
    CHECK(symlink("real.json", link_path) == 0);
    CHECK_OK(mapping_trace_start(link_path));
    traced_work(dev);
    CHECK_OK(mapping_trace_stop());
    struct stat st;
    CHECK(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(is_trace_json(real));

    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(out, sizeof out, "%s/out.json", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    mapping_clear_last_error();
    CHECK_REFUSED(mapping_trace_start(fifo), MAPPING_ERR_INVALID_ARGUMENT); /* no reader yet */
    CHECK(strstr(mapping_last_error_message(), "no reader") != NULL);
    fflush(NULL);
    pid_t reader = fork();
    CHECK(reader >= 0);
    if (reader == 0) { /* cat fifo > out */
        FILE *in = fopen(fifo, "r"), *o = fopen(out, "w");
        char b[4096];
        size_t k;
        while (in && o && (k = fread(b, 1, sizeof b, in)) > 0)
            fwrite(b, 1, k, o);
        _exit(in && o && fclose(o) == 0 ? 0 : 1);
    }
    mapping_status started = MAPPING_ERR_INVALID_ARGUMENT;
    for (int i = 0; i < 200 && started != MAPPING_OK; i++) { /* until the reader has opened it */
        started = mapping_trace_start(fifo);
        if (started != MAPPING_OK)
            usleep(10000);
    }
    CHECK_OK(started);
    traced_work(dev);
    CHECK_OK(mapping_trace_stop());
    int status = 0;
    CHECK(waitpid(reader, &status, 0) == reader && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(is_trace_json(out));

    /* fork: the child stops the trace (what the library's exit handler does
     * at exit; _exit then, so LeakSanitizer does not count the driver's
     * memory the child inherited) after the parent wrote its trace; the
     * parent's file stays the parent's. */
    char path[160];
    snprintf(path, sizeof path, "%s/forked.json", dir);
    CHECK_OK(mapping_trace_start(path));
    traced_work(dev);
    fflush(NULL);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        usleep(300000);
        mapping_status st = mapping_trace_stop(); /* the child must not write */
        _exit(st == MAPPING_OK && !mapping_trace_active() ? 0 : 1);
    }
    CHECK_OK(mapping_trace_stop());
    long parent_bytes = file_bytes(path);
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(file_bytes(path) == parent_bytes && parent_bytes > 1000);

    remove(path);
    remove(out);
    remove(fifo);
    remove(link_path);
    remove(real);
    CHECK(rmdir(dir) == 0); /* and no temporary file was left behind */
}

/* The whole of what can be read from fd now (a pipe: its writer closed). */
static char *read_fd(int fd)
{
    size_t cap = 1 << 16, len = 0;
    char *s = malloc(cap);
    for (ssize_t got; s && (got = read(fd, s + len, cap - len - 1)) > 0;) {
        len += (size_t)got;
        if (len + 1 == cap) {
            char *t = realloc(s, cap *= 2);
            if (!t)
                free(s);
            s = t;
        }
    }
    if (s)
        s[len] = '\0';
    return s;
}

static bool ends_a_trace(const char *s)
{
    size_t n = strlen(s);
    return n > 3 && strstr(s, "\"traceEvents\"") && strcmp(s + n - 3, "]}\n") == 0;
}

/* A path that reaches its file through /proc (/dev/stdout ->
 * /proc/self/fd/1) is the program's own output. Before: when stdout was a
 * pipe, the link was replaced by a regular file holding the trace (as root,
 * MAPPING_TRACE=/dev/stdout replaced /dev/stdout) and the pipe got nothing;
 * when stdout was a file, the file was replaced, losing what the program
 * had written to it. Now both are written in place (a file appended to),
 * the link kept. And a dangling link is followed: its target is created,
 * the link kept (before: the link was replaced). */
TEST(trace_through_a_link_into_proc_is_written_in_place_and_links_are_kept)
{
    mapping_device *dev = test_device();
    char dir[] = "/tmp/mapping-trace-proc-XXXXXX", link_path[160], target[64], report[160], made[160];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(link_path, sizeof link_path, "%s/stdout", dir);
    struct stat st;
    mapping_buffer *buf;
    char host[64] = {1};
    CHECK_OK(mapping_allocate_gpu(dev, sizeof host, &buf));

    /* A pipe (the trace is small: it fits the pipe's buffer). */
    int p[2];
    CHECK(pipe(p) == 0);
    snprintf(target, sizeof target, "/proc/self/fd/%d", p[1]);
    CHECK(symlink(target, link_path) == 0);
    CHECK_OK(mapping_trace_start(link_path));
    for (int i = 0; i < 20; i++)
        CHECK_OK(mapping_sync_to_gpu_range(NULL, host, buf, 0, sizeof host));
    CHECK_OK(mapping_trace_stop());
    close(p[1]);
    char *s = read_fd(p[0]);
    close(p[0]);
    CHECK(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(s && s[0] == '{' && ends_a_trace(s));
    free(s);
    CHECK(remove(link_path) == 0);

    /* A regular file the program writes to: appended to, never replaced. */
    snprintf(report, sizeof report, "%s/report.txt", dir);
    int fd = open(report, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && write(fd, "REPORT\n", 7) == 7);
    snprintf(target, sizeof target, "/proc/self/fd/%d", fd);
    CHECK(symlink(target, link_path) == 0);
    CHECK_OK(mapping_trace_start(link_path));
    for (int i = 0; i < 20; i++)
        CHECK_OK(mapping_sync_to_gpu_range(NULL, host, buf, 0, sizeof host));
    CHECK_OK(mapping_trace_stop());
    CHECK(write(fd, "MORE\n", 5) == 5); /* the program's descriptor still names the file */
    close(fd);
    CHECK(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode));
    fd = open(report, O_RDONLY);
    CHECK(fd >= 0);
    s = read_fd(fd);
    close(fd);
    /* One offset: the program's write after the trace follows it. */
    CHECK(s && strncmp(s, "REPORT\n{", 8) == 0 && strstr(s, "\"traceEvents\"") != NULL);
    CHECK(strlen(s) > 8 && strcmp(s + strlen(s) - 8, "]}\nMORE\n") == 0);
    free(s);
    CHECK(remove(link_path) == 0);

    /* A descriptor open for reading only (/dev/stdin redirected from a
     * file): refused at start, the file untouched (before: the file the
     * program reads was replaced by the trace). */
    snprintf(made, sizeof made, "%s/input.txt", dir);
    fd = open(made, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && write(fd, "INPUT\n", 6) == 6 && close(fd) == 0);
    fd = open(made, O_RDONLY);
    CHECK(fd >= 0);
    snprintf(target, sizeof target, "/proc/self/fd/%d", fd);
    CHECK(symlink(target, link_path) == 0);
    mapping_status refused = mapping_trace_start(link_path);
    if (refused == MAPPING_OK)
        mapping_trace_stop();
    CHECK(refused == MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), strerror(EBADF)) != NULL);
    close(fd);
    fd = open(made, O_RDONLY);
    CHECK(fd >= 0);
    s = read_fd(fd);
    close(fd);
    CHECK(s && strcmp(s, "INPUT\n") == 0);
    free(s);
    CHECK(remove(link_path) == 0 && remove(made) == 0);

    /* A dangling link: the file it names is made; the link stays. */
    snprintf(made, sizeof made, "%s/made.json", dir);
    CHECK(symlink("made.json", link_path) == 0);
    CHECK_OK(mapping_trace_start(link_path));
    CHECK_OK(mapping_sync_to_gpu_range(NULL, host, buf, 0, sizeof host));
    CHECK_OK(mapping_trace_stop());
    CHECK(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(is_trace_json(made));

    mapping_free_gpu(buf);
    remove(made);
    remove(report);
    remove(link_path);
    CHECK(rmdir(dir) == 0); /* and no temporary file was left behind */
}

/* Before: the trace replaced a file with a new one of mode 0666 less the
 * umask, so a trace kept private (0600) became readable by all. */
TEST(trace_replacing_a_file_keeps_its_permissions)
{
    mapping_device *dev = test_device();
    char dir[] = "/tmp/mapping-trace-mode-XXXXXX", path[160];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    mode_t mask = umask(022);
    static const mode_t modes[] = {0600, 0640, 0444};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        FILE *f = fopen(path, "w");
        CHECK(f && fputs("old", f) >= 0 && fclose(f) == 0);
        CHECK(chmod(path, modes[i]) == 0);
        CHECK_OK(mapping_trace_start(path));
        traced_work(dev);
        CHECK_OK(mapping_trace_stop());
        struct stat st;
        CHECK(stat(path, &st) == 0 && is_trace_json(path));
        if ((st.st_mode & 07777) != modes[i])
            test_fail(__FILE__, __LINE__, "a file of mode %03o became %03o", (unsigned)modes[i],
                      (unsigned)(st.st_mode & 07777));
        CHECK(st.st_uid == geteuid());
        remove(path);
    }
    umask(mask);
    CHECK(rmdir(dir) == 0); /* and no temporary file was left behind */
}

/* ---- a stop that cannot finish writing holds up no one else ---- */

static int count_events(const char *s)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, "\"name\":\"write\"")); p++)
        n++;
    return n;
}

typedef struct stalled_stop {
    mapping_status status;
    int            reader;      /* the FIFO's read end */
    _Atomic bool   drain_now;   /* the test is done measuring */
    char          *drained;     /* what the reader got */
} stalled_stop;

static void *stop_in_thread(void *arg)
{
    stalled_stop *s = arg;
    s->status = mapping_trace_stop();
    return NULL;
}

/* Reads the FIFO when told, or after 3 s (so that a stop that holds the
 * recorder's lock while it writes is seen as slow, not as a hang). */
static void *drain_later(void *arg)
{
    stalled_stop *s = arg;
    for (int i = 0; i < 300 && !atomic_load(&s->drain_now); i++)
        usleep(10000);
    s->drained = read_fd(s->reader);
    return NULL;
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Before: the stop wrote the file holding the recorder's lock, so while a
 * FIFO's reader did not read (or a disk was slow), every thread that
 * touched the recorder (an event ending, a start) waited for it. Now the
 * recording is taken under the lock and written after it. */
TEST(trace_stop_writing_into_a_stalled_fifo_holds_up_no_other_thread)
{
    mapping_device *dev = test_device();
    char dir[] = "/tmp/mapping-trace-stall-XXXXXX", fifo[160], other[160];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(other, sizeof other, "%s/other.json", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    stalled_stop s = {.status = MAPPING_ERR_IO};
    s.reader = open(fifo, O_RDONLY | O_NONBLOCK);
    CHECK(s.reader >= 0);
    CHECK_OK(mapping_trace_start(fifo));
    CHECK(fcntl(s.reader, F_SETFL, 0) == 0); /* a writer is there: reads block */
    mapping_buffer *buf;
    char host[64] = {1};
    CHECK_OK(mapping_allocate_gpu(dev, sizeof host, &buf));
    for (int i = 0; i < 3000; i++) /* a trace of some 400 KB: more than a pipe holds */
        CHECK_OK(mapping_sync_to_gpu_range(NULL, host, buf, 0, sizeof host));
    pthread_t stopper, drainer;
    CHECK(pthread_create(&drainer, NULL, drain_later, &s) == 0);
    CHECK(pthread_create(&stopper, NULL, stop_in_thread, &s) == 0);
    for (int i = 0; i < 5000 && mapping_trace_active(); i++)
        usleep(1000); /* until the stop has taken the recording */
    CHECK(!mapping_trace_active());
    usleep(50000); /* the stop is writing, stalled */

    double t0 = seconds_now();
    mapping_status started = mapping_trace_start(other); /* takes the recorder's lock */
    double waited = seconds_now() - t0;
    CHECK_OK(started);
    CHECK_OK(mapping_sync_to_gpu_range(NULL, host, buf, 0, sizeof host));
    CHECK_OK(mapping_trace_stop());
    if (waited > 1.5)
        test_fail(__FILE__, __LINE__, "a trace start waited %.1f s for a stop writing into a stalled FIFO", waited);

    atomic_store(&s.drain_now, true);
    pthread_join(stopper, NULL);
    pthread_join(drainer, NULL);
    CHECK_OK(s.status);
    CHECK(s.drained && ends_a_trace(s.drained) && count_events(s.drained) >= 3000);
    CHECK(is_trace_json(other));
    free(s.drained);
    close(s.reader);
    mapping_free_gpu(buf);
    remove(other);
    remove(fifo);
    CHECK(rmdir(dir) == 0);
}
