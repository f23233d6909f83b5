/*
 * Regressions of issue 36 (the mirror core where every feature meets), one
 * test per finding, written to the semantics the mirror core now promises
 * (docs/mirrors.md):
 *
 * - a tracked CPU write behaves exactly like mark_cpu_modified of the bytes
 *   whose content changed, made at the start of the next call on the mirror
 *   family (T1: a GPU mark over a tracked write to bytes in sync is a
 *   CONFLICT, as with an explicit CPU mark; page granularity never makes a
 *   false conflict, whatever ran in between);
 * - the race checker (MAPPING_CHECK=races) reports every unordered access,
 *   the library's own threads included, and never weakens write tracking
 *   nor adds to it (T2, T4, and two findings of the matrix model: its guard
 *   made uffd-tracked pages count as written, and a wrapped mirror's memory
 *   read as not writable);
 * - a sharded mirror that cannot be tracked says why in its own words (T3);
 * - closing the devices of a live multimirror does not crash;
 * - the bytes of the heap beside a tracked mirror of an odd size are not the
 *   mirror's.
 *
 * The write-tracking mechanism and the race checker are chosen once per
 * process, so a test that needs one sets the environment before it opens
 * its device (or runs in a forked child). A mechanism this machine lacks
 * makes the test SKIP, saying why.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "harness.h"

enum { PG = 4096 };

/* ---- helpers ---- */

/* Forces the write-tracking mechanism of this process; must run before the
 * library first looks (before test_device()). */
static void force_mechanism(const char *mechanism)
{
    setenv("MAPPING_TRACK", mechanism, 1);
}

/* SKIPs unless the process tracks with `want` (after force_mechanism). */
static void need_mechanism(mapping_track_mechanism want)
{
    mapping_track_mechanism got = mapping_write_tracking(NULL);
    if (got != want)
        test_skip("needs %s write tracking; this process has %s", want == MAPPING_TRACK_UFFD ? "uffd" : "mprotect",
                  mapping_write_tracking_description());
}

static void need_any_mechanism(void)
{
    if (mapping_write_tracking(NULL) == MAPPING_TRACK_NONE)
        test_skip("no write tracking here: %s", mapping_write_tracking_description());
}

static void device_bytes(mapping_mirror *m, unsigned char *out)
{
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), out,
                                       mapping_mirror_size(m)));
}

/* Findings are collected, then reported together: a regression test should
 * say everything that is wrong, not only the first thing. */
typedef struct findings {
    char text[4096];
    size_t len;
    int count;
} findings;

static void finding(findings *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void finding(findings *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (f->len + 8 < sizeof f->text) {
        int n = snprintf(f->text + f->len, sizeof f->text - f->len, "\n  - ");
        f->len += n > 0 ? (size_t)n : 0;
        if (f->len < sizeof f->text) {
            n = vsnprintf(f->text + f->len, sizeof f->text - f->len, fmt, ap);
            f->len += n > 0 ? (size_t)n : 0;
            if (f->len >= sizeof f->text)
                f->len = sizeof f->text - 1;
        }
    }
    va_end(ap);
    f->count++;
}

static void report(findings *f, const char *what)
{
    if (f->count)
        test_fail(__FILE__, __LINE__, "%s: %d finding(s):%s", what, f->count, f->text);
    printf("%s: as specified\n", what);
}

static uint64_t conflicts_of(mapping_device *dev)
{
    return test_stats(dev).conflicts;
}

/* Runs fn in a forked child with its stderr captured; returns the wait
 * status. A child must open its own devices (no driver survives a fork). */
static int run_in_child(int (*fn)(void *), void *arg, char *err, size_t cap)
{
    int p[2];
    CHECK(pipe(p) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        dup2(p[1], 2);
        alarm(60); /* a hang ends as SIGALRM */
        int rc = fn(arg);
        fflush(NULL);
        _exit(rc);
    }
    close(p[1]);
    size_t n = 0;
    for (ssize_t k; n + 1 < cap && (k = read(p[0], err + n, cap - 1 - n)) > 0;)
        n += (size_t)k;
    err[n] = 0;
    char sink[256];
    while (read(p[0], sink, sizeof sink) > 0)
        ;
    close(p[0]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    return status;
}

static const char *describe_status(int status, char *buf, size_t cap)
{
    if (WIFEXITED(status))
        snprintf(buf, cap, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, cap, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(buf, cap, "status 0x%x", status);
    return buf;
}

/* ---- T1: a tracked write, then a GPU mark over it ---- */

/* The program: a 64 KiB tracked mirror filled with 1 and synced,
 * cpu[100] = 7 without a mark, mark_gpu_modified over the whole mirror,
 * sync to the CPU, sync to the GPU. The tracked write is a CPU mark made at
 * the start of the GPU mark, so the GPU mark meets a CPU modification not
 * yet synced: MAPPING_ERR_CONFLICT, nothing changes, conflicts + 1; the
 * syncs then carry cpu[100] = 7 to the device. (It used to return OK, and
 * the write was lost: cpu[100] 7, gpu[100] 1, both sides "in sync".) */
static void t1(const char *mechanism, const char *diff)
{
    force_mechanism(mechanism);
    if (diff)
        setenv("MAPPING_DEVICE_DIFF", diff, 1);
    mapping_device *dev = test_device();
    need_mechanism(strcmp(mechanism, "uffd") == 0 ? MAPPING_TRACK_UFFD : MAPPING_TRACK_MPROTECT);
    const size_t n = 64 << 10;
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, n, MAPPING_MIRROR_TRACK_WRITES | (diff ? MAPPING_MIRROR_DEVICE_DIFF : 0u), &m));
    unsigned char *cpu = mapping_mirror_cpu(m), *got = malloc(n);
    CHECK(got != NULL);
    memset(cpu, 1, n);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    findings f = {0};
    cpu[100] = 7; /* tracked, no mark */
    uint64_t before = conflicts_of(dev);
    mapping_clear_last_error();
    mapping_status st = mapping_mirror_mark_gpu_modified(m, 0, n);
    if (st != MAPPING_ERR_CONFLICT)
        finding(&f, "mark_gpu_modified(0, %zu) over a tracked write to byte 100 returned %s, expected "
                    "MAPPING_ERR_CONFLICT (as with an explicit mark_cpu_modified)", n, mapping_status_name(st));
    uint64_t delta = conflicts_of(dev) - before;
    if (delta != 1)
        finding(&f, "stats.conflicts grew by %llu, expected 1", (unsigned long long)delta);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    device_bytes(m, got);
    if (cpu[100] != 7 || got[100] != 7)
        finding(&f, "after sync_to_cpu, sync_to_gpu: cpu[100] = %u, gpu[100] = %u, expected 7 on both (the write "
                    "was lost)", cpu[100], got[100]);
    for (size_t i = 0; i < n; i++)
        if (i != 100 && (cpu[i] != 1 || got[i] != 1)) {
            finding(&f, "byte %zu: cpu %u, gpu %u, expected 1 on both", i, cpu[i], got[i]);
            break;
        }
    size_t sc = mapping_mirror_stale_bytes(m, MAPPING_CPU), sg = mapping_mirror_stale_bytes(m, MAPPING_GPU);
    if (sc || sg)
        finding(&f, "after both syncs %zu bytes are stale on the CPU and %zu on the GPU", sc, sg);
    free(got);
    mapping_mirror_destroy(m);
    char what[128];
    snprintf(what, sizeof what, "T1 (%s, device diff %s)", mechanism, diff ? diff : "not asked for");
    report(&f, what);
}

TEST(mirror_core_regressions_t1_uffd_diff_on)
{
    t1("uffd", "on");
}

TEST(mirror_core_regressions_t1_uffd_diff_auto)
{
    t1("uffd", "auto");
}

TEST(mirror_core_regressions_t1_mprotect_diff_on)
{
    t1("mprotect", "on");
}

TEST(mirror_core_regressions_t1_mprotect_diff_auto)
{
    t1("mprotect", "auto");
}

TEST(mirror_core_regressions_t1_uffd_without_diff)
{
    t1("uffd", NULL);
}

TEST(mirror_core_regressions_t1_mprotect_without_diff)
{
    t1("mprotect", NULL);
}

/* The explicit-mark twin of T1: what the tracked write must match. */
TEST(mirror_core_regressions_t1_explicit_mark_twin_conflicts)
{
    mapping_device *dev = test_device();
    const size_t n = 64 << 10;
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, n, MAPPING_MIRROR_DEVICE_DIFF, &m));
    unsigned char *cpu = mapping_mirror_cpu(m);
    memset(cpu, 1, n);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, n));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    cpu[100] = 7;
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 100, 1));
    uint64_t before = conflicts_of(dev);
    CHECK_REFUSED(mapping_mirror_mark_gpu_modified(m, 0, n), MAPPING_ERR_CONFLICT);
    CHECK(conflicts_of(dev) == before + 1);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    test_check_mirror_sides_equal(m);
    CHECK(cpu[100] == 7);
    mapping_mirror_destroy(m);
}

/* ---- T4: the race guard's end and mprotect tracking ---- */

static _Atomic int t4_download_done;

static void t4_mark_done(void *user)
{
    (void)user;
    atomic_store(&t4_download_done, 1);
}

/* MAPPING_CHECK=races, MAPPING_TRACK=mprotect: a download into an array is
 * queued, and the array is wrapped as a tracked mirror while the download
 * runs. When the race guard ended it made the pages read-write, removing
 * the tracker's protection, so a later write (raw[5 * 4096] = 77) never
 * reached the device. The guard keeps the pages inaccessible until the copy
 * starts (a wrap then is refused: not readable and writable), so the wrap
 * is retried until the copy has started. On the host back end the device
 * models a slow link (0.3 s per copy): one round hits the window every
 * time; elsewhere the array is large (64 MiB) and 6 rounds are run, each
 * wrapping while its download runs. */
static void t4_round(mapping_device *dev, mapping_stream *s, mapping_buffer *buf, unsigned char *raw,
                     unsigned char *got, size_t n, findings *f, int *rounds)
{
    mapping_mirror *m = NULL;
    int refused = 0;
    for (int attempt = 0; attempt < 10 && !m; attempt++) {
        memset(raw, 0, n);
        atomic_store(&t4_download_done, 0);
        CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, raw, n));
        CHECK_OK(mapping_launch_host(s, t4_mark_done, NULL));
        while (!atomic_load(&t4_download_done)) {
            mapping_status st = mapping_mirror_wrap(dev, raw, n, MAPPING_MIRROR_TRACK_WRITES, &m);
            if (st == MAPPING_OK)
                break;
            CHECK(st == MAPPING_ERR_INVALID_ARGUMENT); /* not started: the guard keeps the pages inaccessible */
            refused++;
            usleep(20);
        }
        if (m && atomic_load(&t4_download_done)) { /* the download ended during the wrap: not the case */
            CHECK_OK(mapping_stream_synchronize(s));
            mapping_mirror_destroy(m);
            m = NULL;
        }
        CHECK_OK(mapping_stream_synchronize(s));
    }
    if (!m)
        return;
    (*rounds)++;
    for (size_t i = 0; i < n; i++)
        if (raw[i] != 0x11)
            test_fail(__FILE__, __LINE__, "the download did not land: raw[%zu] = 0x%02x", i, raw[i]);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    device_bytes(m, got);
    if (memcmp(got, raw, n) != 0)
        finding(f, "round %d: the first sync of the wrapped array did not make the device equal to it", *rounds);
    char perms[5];
    test_page_perms(raw + 5 * PG, perms);
    raw[5 * PG] = 77; /* tracked, no mark */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    device_bytes(m, got);
    if (got[5 * PG] != 77)
        finding(f, "round %d (%d wraps refused before the copy started): raw[5 * 4096] = 77 never reached the device "
                   "(it holds 0x%02x; the page was %s before the write, where mprotect tracking keeps it read-only)",
                *rounds, refused, got[5 * PG], perms);
    else if (memcmp(got, raw, n) != 0)
        finding(f, "round %d: the device differs from the array after the sync", *rounds);
    mapping_mirror_destroy(m);
}

TEST(mirror_core_regressions_t4_race_guard_end_keeps_mprotect_tracking)
{
    if (TEST_TSAN)
        test_skip("ThreadSanitizer: T4 wraps the array while a download writes it, on purpose");
    setenv("MAPPING_CHECK", "races", 1);
    force_mechanism("mprotect");
    bool host = strcmp(test_backend(), "host") == 0;
    mapping_device *dev = NULL;
    if (host) {
        mapping_device_desc desc = {.backend = "host", .link_latency = 0.3, .link_bandwidth = 1e9};
        CHECK_OK(mapping_open(&desc, &dev));
    } else {
        dev = test_device();
    }
    need_mechanism(MAPPING_TRACK_MPROTECT);
    const size_t n = host ? 16 * PG : (size_t)64 << 20;
    mapping_buffer *buf;
    mapping_stream *s;
    CHECK_OK(mapping_allocate_gpu(dev, n, &buf));
    CHECK_OK(mapping_fill_gpu(NULL, buf, 0, n, 0x11));
    CHECK_OK(mapping_stream_create(dev, &s));
    unsigned char *raw = aligned_alloc(PG, n), *got = malloc(n);
    CHECK(raw && got);
    findings f = {0};
    int rounds = 0;
    for (int r = 0; r < (host ? 1 : 6); r++)
        t4_round(dev, s, buf, raw, got, n, &f, &rounds);
    mapping_stream_destroy(s);
    mapping_free_gpu(buf);
    if (host)
        mapping_close(dev);
    free(raw);
    free(got);
    if (!rounds)
        test_skip("could not wrap the array while the download ran (the copy was too quick)");
    printf("%d round(s) wrapped the array while the download ran\n", rounds);
    report(&f, "T4 (MAPPING_CHECK=races, MAPPING_TRACK=mprotect)");
}

/* ---- the race guard and uffd tracking ---- */

/* Found by the matrix model (cell: race checker on, uffd): the race guard
 * of a queued upload (read-only pages until the copy completes) made every
 * page it guarded count as written by the program with uffd tracking, so a
 * clean tracked mirror read as stale after its own sync and the next sync
 * sent it all again. The race checker changes nothing a race-free program
 * sees: after a queued sync of an untouched tracked mirror, nothing is
 * stale and the next sync moves nothing. */
TEST(mirror_core_regressions_race_guard_does_not_make_uffd_tracked_pages_written)
{
    force_mechanism("uffd");
    mapping_device *dev = test_device();
    need_mechanism(MAPPING_TRACK_UFFD);
    CHECK_OK(mapping_device_set_checks(dev, MAPPING_DEVICE_CHECK_RACES));
    const size_t n = 16 * PG;
    mapping_stream *s;
    mapping_mirror *m;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_mirror_create(dev, n, MAPPING_MIRROR_TRACK_WRITES, &m));
    test_pattern(mapping_mirror_cpu(m), n, 9);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* blocking: no guard */
    findings f = {0};
    size_t stale = mapping_mirror_stale_bytes(m, MAPPING_GPU);
    if (stale)
        finding(&f, "%zu bytes stale on the GPU after a blocking sync of the whole mirror", stale);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, n)); /* all of it again, queued: guarded while it waits */
    CHECK_OK(mapping_mirror_sync_to_gpu(s, m));
    CHECK_OK(mapping_stream_synchronize(s));
    stale = mapping_mirror_stale_bytes(m, MAPPING_GPU);
    if (stale)
        finding(&f, "%zu bytes stale on the GPU after a queued sync of the whole mirror (nothing written since)", stale);
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_stats after = test_stats(dev);
    if (after.h2d_bytes != before.h2d_bytes)
        finding(&f, "the next sync moved %llu bytes", (unsigned long long)(after.h2d_bytes - before.h2d_bytes));
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
    mapping_stream_destroy(s);
    report(&f, "race checker on a device, uffd tracking");
}

/* Found by the matrix model (cell: sharded, streams, race checker on): the
 * first sync to the CPU of a wrapped mirror checks once that its memory is
 * writable (/proc/self/maps); while an upload of the mirror was queued, the
 * race guard's read-only protection of the upload's source made it refuse
 * with MAPPING_ERR_INVALID_ARGUMENT ("not writable in part or whole"), and
 * the device's result never reached the CPU. The race checker changes
 * nothing a race-free program sees: the sync to the CPU orders itself after
 * the upload and works, on the upload's stream and on another. */
static void guarded_wrap_case(mapping_device *dev, int same_stream, findings *f)
{
    const size_t n = 16 * PG;
    mapping_stream *s, *s2;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_stream_create(dev, &s2));
    unsigned char *mem = aligned_alloc(PG, n);
    CHECK(mem != NULL);
    memset(mem, 1, n);
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_wrap(dev, mem, n, 0, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), 100, 0x42));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, 100)); /* the device's result, for the CPU */
    memset(mem + n / 2, 3, n / 2);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, n / 2, n / 2)); /* the CPU's, for the device */
    test_gate gate = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &gate));
    CHECK_OK(mapping_mirror_sync_to_gpu(s, m)); /* queued: its source pages are guarded */
    mapping_clear_last_error();
    mapping_status st = mapping_mirror_sync_to_cpu(same_stream ? s : s2, m);
    if (st != MAPPING_OK)
        finding(f, "sync_to_cpu on %s while an upload of the mirror is queued returned %s: %s",
                same_stream ? "the upload's stream" : "another stream", mapping_status_name(st),
                mapping_last_error_message());
    test_gate_open(&gate);
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_OK(mapping_stream_synchronize(s2));
    if (st == MAPPING_OK && (mem[0] != 0x42 || mem[99] != 0x42))
        finding(f, "after the sync to the CPU, cpu[0] = 0x%02x, expected the device's 0x42", mem[0]);
    if (mapping_mirror_stale_bytes(m, MAPPING_CPU) != (st == MAPPING_OK ? 0u : 100u))
        finding(f, "%zu bytes stale on the CPU after the streams ended", mapping_mirror_stale_bytes(m, MAPPING_CPU));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
    mapping_stream_destroy(s);
    mapping_stream_destroy(s2);
    free(mem);
}

TEST(mirror_core_regressions_race_guard_does_not_make_a_wrapped_mirror_read_only)
{
    mapping_device *dev = test_device();
    CHECK_OK(mapping_device_set_checks(dev, MAPPING_DEVICE_CHECK_RACES));
    findings f = {0};
    guarded_wrap_case(dev, 1, &f);
    guarded_wrap_case(dev, 0, &f);
    report(&f, "race checker on a device, a wrapped mirror's first sync to the CPU");
}

/* ---- T2: the race checker and host functions ---- */

enum { T2_BYTES = 16 * PG };
static _Atomic int t2_flags[4];

static void t2_wait_flag(void *user)
{
    int i = (int)(intptr_t)user;
    for (int k = 0; k < 10000 && !atomic_load(&t2_flags[i]); k++)
        usleep(1000);
}

static unsigned char *t2_host;

/* A host function that writes the source of the queued copy. */
static void t2_write_source(void *user)
{
    int done = (int)(intptr_t)user;
    t2_host[5 * PG + 17] = 2;
    atomic_store(&t2_flags[done], 1);
}

/* A host function that says it began (flag 3), then waits for flag 2: once
 * it runs, the function before it on its stream has returned and the guard
 * that function's write opened is closed again (mprotect opens a page for
 * every thread, so a write of the main thread while that function runs is
 * not seen; the test writes after). */
static void t2_began_then_wait(void *user)
{
    atomic_store(&t2_flags[3], 1);
    t2_wait_flag(user);
}

static bool t2_wait(int i)
{
    for (int k = 0; k < 5000; k++) {
        if (atomic_load(&t2_flags[i]))
            return true;
        usleep(1000);
    }
    return false;
}

typedef struct t2_world {
    mapping_device *dev;
    mapping_stream *s1, *s2;
    mapping_buffer *buf;
} t2_world;

static int t2_open(t2_world *w)
{
    setenv("MAPPING_CHECK", "races", 1);
    mapping_device_desc desc = {.backend = test_backend()};
    if (mapping_open(&desc, &w->dev))
        return TEST_SKIP_CODE;
    if (mapping_stream_create(w->dev, &w->s1) || mapping_stream_create(w->dev, &w->s2) ||
        mapping_allocate_gpu(w->dev, T2_BYTES, &w->buf))
        return 3;
    t2_host = aligned_alloc(PG, T2_BYTES);
    if (!t2_host)
        return 3;
    memset(t2_host, 1, T2_BYTES);
    return 0;
}

/* Child: an upload queued on s1 behind a gate; a host function on s2 (not
 * ordered with it) writes the upload's source; then the main thread writes
 * it too. The first write must stop the process with a report. */
static int t2_other_stream_child(void *arg)
{
    (void)arg;
    t2_world w;
    int rc = t2_open(&w);
    if (rc)
        return rc;
    if (mapping_launch_host(w.s1, t2_wait_flag, (void *)(intptr_t)0) ||
        mapping_sync_to_gpu_range(w.s1, t2_host, w.buf, 0, T2_BYTES) ||
        mapping_launch_host(w.s2, t2_write_source, (void *)(intptr_t)1))
        return 3;
    if (!t2_wait(1))
        return 4; /* the host function never ran */
    fprintf(stderr, "T2-MARK: the host function on another stream wrote the upload's source unreported\n");
    t2_host[6 * PG + 17] = 3; /* the main thread's own racing write */
    fprintf(stderr, "T2-MARK: the main thread wrote the upload's source unreported\n");
    atomic_store(&t2_flags[0], 1);
    mapping_stream_synchronize(w.s1);
    return 0;
}

TEST(mirror_core_regressions_t2_race_check_reports_a_host_function_on_another_stream)
{
    if (strcmp(test_backend(), "cuda") == 0) /* the gate would hold the other stream's host function too */
        test_skip("CUDA runs the host functions of every stream on one driver thread: a gate on one stream holds "
                  "the other's");
    char err[8192], st[96];
    int status = run_in_child(t2_other_stream_child, NULL, err, sizeof err);
    if (WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP_CODE)
        test_skip("back end %s is absent", test_backend());
    printf("child: %s; its stderr:\n%s\n", describe_status(status, st, sizeof st), err);
    bool fn_missed = strstr(err, "T2-MARK: the host function") != NULL;
    bool main_missed = strstr(err, "T2-MARK: the main thread") != NULL;
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "the child could not set up the race (%s)", st);
    if (fn_missed && main_missed)
        test_fail(__FILE__, __LINE__, "neither the host function on another stream nor the main thread's own "
                                      "racing write to the source of a queued upload was reported");
    if (fn_missed)
        test_fail(__FILE__, __LINE__, "the host function on another stream that wrote the source of a queued upload "
                                      "was not reported (the main thread's write after it was: %s)", st);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
        test_fail(__FILE__, __LINE__, "the child was not stopped by the check (%s)", st);
    CHECK(strstr(err, "MAPPING_CHECK=races") != NULL);
    CHECK(strstr(err, "raced an asynchronous host-to-device copy") != NULL);
    CHECK(strstr(err, "queued on stream 0x") != NULL);
}

/* Child: a host function queued on the upload's own stream BEFORE the
 * upload writes its source (ordered: not a race, not reported); then, with
 * the upload still queued, the main thread writes the source: a race, which
 * must be reported. The ordered write used to open the guard for good. */
static int t2_ordered_child(void *arg)
{
    (void)arg;
    t2_world w;
    int rc = t2_open(&w);
    if (rc)
        return rc;
    if (mapping_launch_host(w.s1, t2_wait_flag, (void *)(intptr_t)0) ||
        mapping_launch_host(w.s1, t2_write_source, (void *)(intptr_t)1) ||
        mapping_launch_host(w.s1, t2_began_then_wait, (void *)(intptr_t)2) ||
        mapping_sync_to_gpu_range(w.s1, t2_host, w.buf, 0, T2_BYTES))
        return 3;
    atomic_store(&t2_flags[0], 1);
    if (!t2_wait(1) || !t2_wait(3))
        return 4;
    fprintf(stderr, "T2-MARK: the ordered host function wrote the source before the upload, unreported\n");
    t2_host[6 * PG + 17] = 3; /* the main thread's racing write: the upload is still queued */
    fprintf(stderr, "T2-MARK: the main thread's racing write was not reported\n");
    atomic_store(&t2_flags[2], 1);
    mapping_stream_synchronize(w.s1);
    return 0;
}

TEST(mirror_core_regressions_t2_race_check_an_ordered_host_function_does_not_open_the_guard)
{
    char err[8192], st[96];
    int status = run_in_child(t2_ordered_child, NULL, err, sizeof err);
    if (WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP_CODE)
        test_skip("back end %s is absent", test_backend());
    printf("child: %s; its stderr:\n%s\n", describe_status(status, st, sizeof st), err);
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "the child could not set up the race (%s)", st);
    if (!strstr(err, "T2-MARK: the ordered host function"))
        test_fail(__FILE__, __LINE__, "a host function queued on the upload's own stream before it was reported as a "
                                      "race (%s): it is ordered work", st);
    if (strstr(err, "T2-MARK: the main thread"))
        test_fail(__FILE__, __LINE__, "the main thread's write to the source of a queued upload was not reported once "
                                      "an ordered host function had written the source (the guard was opened for good)");
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
        test_fail(__FILE__, __LINE__, "the child was not stopped by the check (%s)", st);
    CHECK(strstr(err, "raced an asynchronous host-to-device copy") != NULL);
}

/* ---- T3: a sharded mirror with tracking and slices off page boundaries ---- */

/* Slices of 6144 bytes share a page. Either the library tracks them (then
 * every write on the shared page reaches its own shard's device), or it
 * refuses with a message that names mapping_mirror_create_sharded and the
 * page rule. It used to name mapping_mirror_wrap and "another mirror" (the
 * first shard). */
TEST(mirror_core_regressions_t3_sharded_tracking_with_slices_off_pages_says_why)
{
    mapping_device *devs[2] = {test_device(), test_device2()};
    need_any_mechanism();
    enum { GRANULE = 8, N = 3 * PG };
    unsigned char *host = aligned_alloc(PG, N);
    CHECK(host != NULL);
    test_pattern(host, N, 3);
    mapping_mirror *shards[2] = {NULL, NULL};
    mapping_clear_last_error();
    mapping_status st = mapping_mirror_create_sharded(devs, 2, host, N, GRANULE, MAPPING_MIRROR_TRACK_WRITES, shards);
    if (st == MAPPING_OK) {
        printf("tracked: slices of %zu and %zu bytes\n", mapping_mirror_size(shards[0]), mapping_mirror_size(shards[1]));
        for (int i = 0; i < 2; i++)
            CHECK_OK(mapping_mirror_sync_to_gpu(NULL, shards[i]));
        host[PG + 100] = 0x51;            /* shard 0, on the shared page */
        host[N / 2 + 100] = 0x52;         /* shard 1, on the shared page */
        host[N - 1] = 0x53;               /* shard 1, its last page */
        for (int i = 0; i < 2; i++) {
            CHECK_OK(mapping_mirror_sync_to_gpu(NULL, shards[i]));
            test_check_mirror_sides_equal(shards[i]);
        }
        for (int i = 0; i < 2; i++)
            mapping_mirror_destroy(shards[i]);
        free(host);
        return;
    }
    const char *msg = mapping_last_error_message();
    printf("refused: %s: %s\n", mapping_status_name(st), msg);
    findings f = {0};
    if (st != MAPPING_ERR_UNSUPPORTED && st != MAPPING_ERR_INVALID_ARGUMENT)
        finding(&f, "refused with %s, expected MAPPING_ERR_UNSUPPORTED or MAPPING_ERR_INVALID_ARGUMENT",
                mapping_status_name(st));
    if (mapping_last_error() != st)
        finding(&f, "the refusal was not recorded as the thread's last error");
    if (!strstr(msg, "mapping_mirror_create_sharded"))
        finding(&f, "the message does not name mapping_mirror_create_sharded: \"%s\"", msg);
    if (!strstr(msg, "page"))
        finding(&f, "the message does not state the page rule (slices of a tracked sharded mirror must end on a "
                    "page): \"%s\"", msg);
    if (strstr(msg, "mapping_mirror_wrap"))
        finding(&f, "the message names mapping_mirror_wrap, which the caller never called: \"%s\"", msg);
    if (strstr(msg, "another mirror"))
        finding(&f, "the message blames \"another mirror\" (the sharded mirror's own first slice): \"%s\"", msg);
    if (shards[0] || shards[1])
        finding(&f, "a refused create_sharded left shards behind");
    free(host);
    report(&f, "T3 (create_sharded, tracked, slices of 6144 bytes)");
}

/* ---- a multimirror whose devices are closed first ---- */

/* Child: a multimirror over two device objects, used, then its devices
 * closed while it lives (documented misuse). Each close either works or
 * refuses with MAPPING_ERR_BUSY naming the multimirror; nothing crashes:
 * where close works, the multimirror is left alive, so the host array the
 * program holds (mapping_multimirror_cpu before the close) stays its to
 * read and write until the multimirror is destroyed (it used to be device
 * 0's page-locked memory, freed by the close: the next access segfaulted).
 * Exit 0 when so; 10 + k for a wrong answer. */
static int closed_first_child(void *arg)
{
    (void)arg;
    mapping_device_desc desc = {.backend = test_backend()};
    mapping_device *devs[2];
    if (mapping_open(&desc, &devs[0]) || mapping_open(&desc, &devs[1]))
        return TEST_SKIP_CODE;
    mapping_multimirror *m;
    if (mapping_multimirror_create(devs, 2, 3 * PG + 123, &m))
        return 3;
    volatile unsigned char *cpu = mapping_multimirror_cpu(m);
    memset((void *)cpu, 7, 3 * PG + 123);
    mapping_stream *s;
    if (mapping_multimirror_mark_cpu_modified(m, 0, 3 * PG + 123) || mapping_multimirror_sync_to_gpu(NULL, m, 0) ||
        mapping_stream_create(devs[1], &s) || mapping_multimirror_sync_to_gpu(s, m, 1) ||
        mapping_multimirror_mark_gpu_modified(m, 0, 100, 10))
        return 3;
    int busy = 0;
    for (int i = 0; i < 2; i++) {
        fprintf(stderr, "CLOSE-MARK: closing device %d with the multimirror alive\n", i);
        mapping_clear_last_error();
        mapping_close(devs[i]);
        mapping_status st = mapping_last_error();
        fprintf(stderr, "CLOSE-MARK: close of device %d: %s: %s\n", i, mapping_status_name(st),
                mapping_last_error_message());
        if (st == MAPPING_ERR_BUSY) {
            if (!strstr(mapping_last_error_message(), "multimirror"))
                return 10; /* BUSY, but not naming the multimirror */
            busy |= 1 << i;
        } else if (st != MAPPING_OK) {
            return 11;
        }
        fprintf(stderr, "CLOSE-MARK: the program reads and writes its host array %p\n", (void *)cpu);
        unsigned sum = 0;
        for (size_t b = 0; b < 3 * PG + 123; b++)
            sum += cpu[b];
        cpu[5] = (unsigned char)(sum + 1);
        fprintf(stderr, "CLOSE-MARK: the host array is still the program's\n");
    }
    fprintf(stderr, "CLOSE-MARK: destroying the multimirror\n");
    mapping_multimirror_destroy(m);
    for (int i = 0; i < 2; i++)
        if (busy & (1 << i)) {
            mapping_clear_last_error();
            mapping_close(devs[i]);
            if (mapping_last_error() != MAPPING_OK)
                return 12; /* still refused once the multimirror is gone */
        }
    fprintf(stderr, "CLOSE-MARK: done\n");
    return 0;
}

TEST(mirror_core_regressions_multimirror_whose_devices_are_closed_first_does_not_crash)
{
    char err[8192], st[96];
    int status = run_in_child(closed_first_child, NULL, err, sizeof err);
    if (WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP_CODE)
        test_skip("back end %s is absent", test_backend());
    printf("child: %s; its stderr:\n%s\n", describe_status(status, st, sizeof st), err);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && strstr(err, "CLOSE-MARK: the program reads") &&
        !strstr(err, "CLOSE-MARK: the host array is still"))
        test_fail(__FILE__, __LINE__, "close returned OK with the multimirror alive, and the program's next access to "
                                      "the multimirror's host array %s (%s): close freed it",
                  strstr(err, "use-after-free") ? "was a use-after-free" : "crashed", st);
    if (WIFSIGNALED(status))
        test_fail(__FILE__, __LINE__, "closing the devices of a live multimirror (then destroying it) crashed the "
                                      "process: %s", st);
    if (WEXITSTATUS(status) == 10)
        test_fail(__FILE__, __LINE__, "close refused with MAPPING_ERR_BUSY without naming the multimirror");
    if (WEXITSTATUS(status) == 11)
        test_fail(__FILE__, __LINE__, "close failed with neither MAPPING_OK nor MAPPING_ERR_BUSY");
    if (WEXITSTATUS(status) == 12)
        test_fail(__FILE__, __LINE__, "a close refused while the multimirror lived was refused again after it was "
                                      "destroyed");
    if (WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "the child could not set up the multimirror (%s)", st);
}

/* ---- conflicts must not depend on timing ---- */

/* A tracked family: the CPU writes byte 10 (no mark), the device writes
 * bytes 100..109 and the program marks them on the GPU. In between: nothing,
 * a stale_bytes query, or a sync of a view of an unrelated page. All three:
 * OK, no conflict counted, and after syncs both sides hold the CPU's byte
 * 10 and the device's 100..109. The collect used to turn the whole written
 * page into CPU marks, so the last two gave "[100, 110) is also modified on
 * the CPU side". */
static const char *const between_names[] = {"nothing", "a stale_bytes query", "a sync of an unrelated view"};

static void timing_mirror(findings *f, mapping_device *dev, int between)
{
    const size_t n = 4 * PG;
    mapping_mirror *m, *v;
    CHECK_OK(mapping_mirror_create(dev, n, MAPPING_MIRROR_TRACK_WRITES, &m));
    unsigned char *cpu = mapping_mirror_cpu(m), *want = malloc(n), *got = malloc(n), dv[10];
    CHECK(want && got);
    test_pattern(cpu, n, 41);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK_OK(mapping_mirror_view(m, 3 * PG, PG, &v));
    memcpy(want, cpu, n);
    cpu[10] = want[10] = (unsigned char)(cpu[10] ^ 0x5a);
    memset(dv, 0xd0, sizeof dv);
    memcpy(want + 100, dv, sizeof dv);
    CHECK_OK(mapping_sync_to_gpu_range(NULL, dv, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m) + 100, 10));
    if (between == 1)
        (void)mapping_mirror_stale_bytes(m, MAPPING_GPU);
    else if (between == 2)
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, v));
    uint64_t before = conflicts_of(dev);
    mapping_status st = mapping_mirror_mark_gpu_modified(m, 100, 10);
    if (st != MAPPING_OK)
        finding(f, "mirror, %s in between: mark_gpu_modified(100, 10) returned %s (%s)", between_names[between],
                mapping_status_name(st), mapping_last_error_message());
    if (conflicts_of(dev) != before)
        finding(f, "mirror, %s in between: stats.conflicts grew by %llu", between_names[between],
                (unsigned long long)(conflicts_of(dev) - before));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    device_bytes(m, got);
    for (size_t i = 0; i < n; i++)
        if (cpu[i] != want[i] || got[i] != want[i]) {
            finding(f, "mirror, %s in between: after the syncs byte %zu is 0x%02x on the CPU and 0x%02x on the "
                       "device, expected 0x%02x", between_names[between], i, cpu[i], got[i], want[i]);
            break;
        }
    mapping_mirror_destroy(v);
    mapping_mirror_destroy(m);
    free(want);
    free(got);
}

static void timing_multimirror(findings *f, mapping_device **devs, int between)
{
    const size_t n = 4 * PG;
    mapping_multimirror *m;
    CHECK_OK(mapping_multimirror_create(devs, 2, n, &m));
    CHECK_OK(mapping_multimirror_track_writes(m));
    unsigned char *cpu = mapping_multimirror_cpu(m), *want = malloc(n), *got = malloc(n), dv[10];
    CHECK(want && got);
    test_pattern(cpu, n, 43);
    CHECK_OK(mapping_multimirror_mark_cpu_modified(m, 0, n));
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 0));
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1));
    memcpy(want, cpu, n);
    cpu[10] = want[10] = (unsigned char)(cpu[10] ^ 0x5a);
    memset(dv, 0xd0, sizeof dv);
    memcpy(want + 100, dv, sizeof dv);
    CHECK_OK(mapping_sync_to_gpu_range(NULL, dv, mapping_multimirror_gpu(m, 0), 100, 10));
    if (between == 1)
        (void)mapping_multimirror_stale_bytes(m, 0);
    else if (between == 2)
        CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1)); /* the other replica: unrelated to device 0's bytes */
    uint64_t before = conflicts_of(devs[0]) + conflicts_of(devs[1]);
    mapping_status st = mapping_multimirror_mark_gpu_modified(m, 0, 100, 10);
    const char *what = between == 2 ? "a sync of the other replica" : between_names[between];
    if (st != MAPPING_OK)
        finding(f, "multimirror, %s in between: mark_gpu_modified(device 0, 100, 10) returned %s (%s)", what,
                mapping_status_name(st), mapping_last_error_message());
    uint64_t after = conflicts_of(devs[0]) + conflicts_of(devs[1]);
    if (after != before)
        finding(f, "multimirror, %s in between: stats.conflicts grew by %llu", what,
                (unsigned long long)(after - before));
    CHECK_OK(mapping_multimirror_sync_to_cpu(m));
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 0));
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1));
    for (int side = -1; side < 2; side++) {
        if (side < 0)
            memcpy(got, cpu, n);
        else
            CHECK_OK(mapping_sync_to_cpu(mapping_multimirror_gpu(m, side), got));
        for (size_t i = 0; i < n; i++)
            if (got[i] != want[i]) {
                finding(f, "multimirror, %s in between: after the syncs byte %zu of side %d is 0x%02x, expected 0x%02x",
                        what, i, side, got[i], want[i]);
                break;
            }
    }
    mapping_multimirror_destroy(m);
    free(want);
    free(got);
}

static void timing(const char *mechanism)
{
    if (mechanism)
        force_mechanism(mechanism);
    mapping_device *devs[2] = {test_device(), test_device2()};
    if (mechanism)
        need_mechanism(MAPPING_TRACK_MPROTECT);
    else
        need_any_mechanism();
    findings f = {0};
    for (int between = 0; between < 3; between++) {
        timing_mirror(&f, devs[0], between);
        timing_multimirror(&f, devs, between);
    }
    char what[160];
    snprintf(what, sizeof what, "conflicts independent of timing (%s)", mapping_write_tracking_description());
    report(&f, what);
}

TEST(mirror_core_regressions_tracked_conflicts_do_not_depend_on_timing)
{
    timing(NULL);
}

TEST(mirror_core_regressions_tracked_conflicts_do_not_depend_on_timing_mprotect)
{
    timing("mprotect");
}

/* ---- heap bytes on a tracked mirror's last page ---- */

/* A tracked mirror the library makes, of a size that is not a page
 * multiple (on OpenCL it came from the heap: its last page held other heap
 * data). The program's own allocations written after a sync are not the
 * mirror's: the next sync moves nothing and needs_sync says 0; with
 * mprotect, read(2) into such a block works. */
static void heap_bytes(const char *mechanism)
{
    if (mechanism)
        force_mechanism(mechanism);
    mapping_device *dev = test_device();
    if (mechanism)
        need_mechanism(MAPPING_TRACK_MPROTECT);
    else
        need_any_mechanism();
    const size_t n = 3 * PG + 100;
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, n, MAPPING_MIRROR_TRACK_WRITES, &m));
    unsigned char *cpu = mapping_mirror_cpu(m);
    test_pattern(cpu, n, 5);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    uintptr_t first = (uintptr_t)cpu & ~(uintptr_t)(PG - 1), last = ((uintptr_t)cpu + n - 1) & ~(uintptr_t)(PG - 1);
    enum { BLOCKS = 512 };
    unsigned char *blocks[BLOCKS], *near = NULL;
    int on_pages = 0;
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = malloc(24 + (size_t)i % 40);
        CHECK(blocks[i] != NULL);
        uintptr_t at = (uintptr_t)blocks[i];
        if (at + 64 > first && at < last + PG) {
            on_pages++;
            if (!near && at >= (uintptr_t)cpu + n)
                near = blocks[i];
        }
    }
    for (int i = 0; i < BLOCKS; i++)
        memset(blocks[i], 0xee, 24);
    printf("mirror at %p (%zu bytes), %d of %d malloc'd blocks on its pages, %s\n", (void *)cpu, n, on_pages, BLOCKS,
           mapping_write_tracking_description());
    findings f = {0};
    if (near && mapping_write_tracking(NULL) == MAPPING_TRACK_MPROTECT) {
        int p[2];
        CHECK(pipe(p) == 0);
        CHECK(write(p[1], "0123456789abcdef", 16) == 16);
        ssize_t got = read(p[0], near, 16);
        if (got != 16)
            finding(&f, "read(2) into the program's own malloc'd block at %p, on the mirror's last page: %zd (%s)",
                    (void *)near, got, got < 0 ? strerror(errno) : "short");
        close(p[0]);
        close(p[1]);
    }
    int due = -1;
    CHECK_OK(mapping_mirror_needs_sync(m, MAPPING_GPU, &due));
    if (due != 0)
        finding(&f, "needs_sync(GPU) says %d after the program wrote only its own heap blocks", due);
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_stats after = test_stats(dev);
    if (after.h2d_bytes != before.h2d_bytes || after.h2d_payload_bytes != before.h2d_payload_bytes)
        finding(&f, "a clean sync moved %llu bytes (payload %llu)",
                (unsigned long long)(after.h2d_bytes - before.h2d_bytes),
                (unsigned long long)(after.h2d_payload_bytes - before.h2d_payload_bytes));
    size_t stale = mapping_mirror_stale_bytes(m, MAPPING_GPU);
    if (stale)
        finding(&f, "%zu bytes stale on the GPU after the sync", stale);
    test_check_mirror_sides_equal(m);
    for (int i = 0; i < BLOCKS; i++)
        free(blocks[i]);
    mapping_mirror_destroy(m);
    char what[160];
    snprintf(what, sizeof what, "heap bytes beside a tracked mirror (%s, %d blocks on its pages)",
             mapping_write_tracking_description(), on_pages);
    report(&f, what);
}

TEST(mirror_core_regressions_heap_bytes_beside_a_tracked_mirror_are_not_its_writes)
{
    heap_bytes(NULL);
}

TEST(mirror_core_regressions_heap_bytes_beside_a_tracked_mirror_are_not_its_writes_mprotect)
{
    heap_bytes("mprotect");
}
