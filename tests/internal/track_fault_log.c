/*
 * Write tracking with uffd and the fault log (track/fault_log.h): a sync after
 * a few faults of the syncing thread scans only the faulted pages; a write
 * the log cannot vouch for (another thread's, the kernel's in read(2), more
 * pages than the log keeps) makes the sync walk the whole mirror, and every
 * written byte arrives either way.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "testing/test_hooks.h"
#include "harness.h"

enum { MIRROR_MIB = 256 };

static void need_fault_log(void)
{
    const char *why = "";
    if (mapping_write_tracking(NULL) != MAPPING_TRACK_UFFD)
        test_skip("the fault log serves uffd tracking, and this process tracks with %s",
                  mapping_write_tracking_description());
    if (!mapping__test_fault_log(&why))
        test_skip("no fault log here: %s", why);
}

static size_t page(void)
{
    size_t g = 0;
    mapping_write_tracking(&g);
    return g;
}

/* The device's byte at `at` equals the CPU's. */
static void check_byte(mapping_mirror *m, size_t at)
{
    unsigned char got = 0;
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m) + at, &got, 1));
    if (got != ((unsigned char *)mapping_mirror_cpu(m))[at])
        test_fail(__FILE__, __LINE__, "device byte %zu is 0x%02x, the CPU's 0x%02x", at, got,
                  ((unsigned char *)mapping_mirror_cpu(m))[at]);
}

/* Whether the process has one thread. Without the fault entry counter
 * (fault_count.h) the fault log (and the clean-sync shortcut) is trusted
 * only then: another thread's fault may have made a page writable and not
 * be counted yet (write_track_uffd.c, sole_thread), so with the back end's
 * threads (PoCL's) every sync walks. */
static bool sole_thread(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long threads = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "Threads:", 8) == 0)
            threads = strtol(line + 8, NULL, 10);
    if (f)
        fclose(f);
    return threads == 1;
}

/* Syncs that walked a whole mirror (the device's statistics). */
static uint64_t walks(mapping_device *dev)
{
    mapping_stats s;
    CHECK_OK(mapping_device_stats(dev, &s));
    return s.tracking_walks;
}

/* Writes one byte per round on this thread, syncs, and checks it arrived;
 * true once a round's sync did not walk (the write faulted, so the sync
 * scanned: only the pages the fault log named), which it must when the
 * process has one thread or counts every thread's faults as they begin,
 * and must not otherwise. */
static bool single_writes_scan_faulted_pages(mapping_mirror *m, unsigned char *cpu, size_t size, unsigned salt)
{
    bool narrowed = false;
    mapping_device *dev = test_device();
    for (unsigned r = 0; r < 24; r++) {
        size_t at = ((size_t)(r + salt) * 40961 * 7 + 5) % size;
        uint64_t before = walks(dev);
        cpu[at] = (unsigned char)(cpu[at] + 1 + r);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        narrowed |= walks(dev) == before;
        check_byte(m, at);
    }
    return narrowed == (sole_thread() || mapping__test_fault_entries());
}

typedef struct poke {
    unsigned char *at;
    unsigned char  value;
} poke;

static void *poke_thread(void *arg)
{
    poke *p = arg;
    *p->at = p->value;
    return NULL;
}

typedef struct sync_job {
    mapping_mirror *m;
    mapping_status  status;
} sync_job;

static void *sync_thread(void *arg)
{
    sync_job *j = arg;
    j->status = mapping_mirror_sync_to_gpu(NULL, j->m);
    return NULL;
}

TEST(tracked_sync_scans_only_the_faulted_pages_and_walks_after_a_write_the_log_missed)
{
    need_fault_log();
    mapping_device *dev = test_device();
    size_t size = (size_t)MIRROR_MIB << 20;
    mapping_mirror *m = NULL;
    CHECK_OK(mapping_mirror_create(dev, size, MAPPING_MIRROR_TRACK_WRITES, &m));
    unsigned char *cpu = mapping_mirror_cpu(m);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(single_writes_scan_faulted_pages(m, cpu, size, 0));

    /* Another thread's write: not in the log (it samples this thread only). */
    uint64_t walked = walks(dev);
    poke p = {cpu + size / 2 + 123, 0xA5};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, poke_thread, &p) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(walks(dev) > walked);
    check_byte(m, size / 2 + 123);
    CHECK(single_writes_scan_faulted_pages(m, cpu, size, 100));

    /* A sync from another thread: it cannot read the count and the log
     * together, so it walks. */
    walked = walks(dev);
    cpu[size / 3] = 0x5A;
    sync_job job = {.m = m, .status = MAPPING_ERR_INVALID_ARGUMENT};
    CHECK(pthread_create(&th, NULL, sync_thread, &job) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK(job.status == MAPPING_OK);
    CHECK(walks(dev) > walked);
    check_byte(m, size / 3);
    CHECK(single_writes_scan_faulted_pages(m, cpu, size, 150));

    /* The kernel's write for this process (read(2) into the array): a fault
     * in kernel mode, counted and not sampled. */
    int fd[2];
    CHECK(pipe(fd) == 0);
    unsigned char src[300];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (unsigned char)(i * 7 + 1);
    CHECK(write(fd[1], src, sizeof src) == (ssize_t)sizeof src);
    walked = walks(dev);
    size_t at = 3 * size / 4 + page() - 100; /* across a page boundary */
    CHECK(read(fd[0], cpu + at, sizeof src) == (ssize_t)sizeof src);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(walks(dev) > walked);
    for (size_t i = 0; i < sizeof src; i++)
        check_byte(m, at + i);
    close(fd[0]);
    close(fd[1]);
    CHECK(single_writes_scan_faulted_pages(m, cpu, size, 200));

    /* More faulted pages than a sync scans one by one: a walk, every page sent. */
    size_t pages = 700;
    for (size_t i = 0; i < pages; i++)
        cpu[(i * 37 % (size / page())) * page() + i % page()] = (unsigned char)(i + 3);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    for (size_t i = 0; i < pages; i++)
        check_byte(m, (i * 37 % (size / page())) * page() + i % page());
    /* The log turns itself off after so many faults, and back on once the
     * faults are few again. */
    CHECK(single_writes_scan_faulted_pages(m, cpu, size, 300));
    mapping_mirror_destroy(m);
}

TEST(tracked_sync_with_the_fault_log_keeps_two_mirrors_apart)
{
    need_fault_log();
    mapping_device *dev = test_device();
    size_t size = (size_t)64 << 20;
    mapping_mirror *a = NULL, *b = NULL;
    CHECK_OK(mapping_mirror_create(dev, size, MAPPING_MIRROR_TRACK_WRITES, &a));
    CHECK_OK(mapping_mirror_create(dev, size, MAPPING_MIRROR_TRACK_WRITES, &b));
    unsigned char *ca = mapping_mirror_cpu(a), *cb = mapping_mirror_cpu(b);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, a));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, b));
    /* Writes to both, syncs of one only: the other's pages stay in the log
     * for its own later sync (several syncs of the first in between). */
    for (unsigned r = 0; r < 16; r++) {
        size_t at_a = ((size_t)r * 9973 * 13 + 1) % size, at_b = ((size_t)r * 7919 * 17 + 2) % size;
        ca[at_a] = (unsigned char)(r + 1);
        cb[at_b] = (unsigned char)(r + 2);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, a));
        check_byte(a, at_a);
        if (r % 4 == 3) {
            CHECK_OK(mapping_mirror_sync_to_gpu(NULL, b));
            for (unsigned q = r - 3; q <= r; q++)
                check_byte(b, ((size_t)q * 7919 * 17 + 2) % size);
        }
    }
    mapping_mirror_destroy(a);
    mapping_mirror_destroy(b);
}

/* The fault entry counter (track/fault_count.h) counts the faults of threads
 * made after it was set up (inherited) and of threads that existed before
 * (one event each): what lets a sync trust "no fault since the last one"
 * while other threads may be inside a fault. */
enum { TOUCHED_PAGES = 64 };

static void *touch_pages(void *arg)
{
    unsigned char *p = arg;
    for (size_t i = 0; i < TOUCHED_PAGES; i++)
        ((volatile unsigned char *)p)[i * (size_t)sysconf(_SC_PAGESIZE)] = 1;
    return NULL;
}

static void *wait_then_touch(void *arg)
{
    atomic_int *go = ((void **)arg)[0];
    while (!atomic_load(go))
        ;
    return touch_pages(((void **)arg)[1]);
}

TEST(fault_entry_counter_counts_the_faults_of_every_thread)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = TOUCHED_PAGES * pg;
    /* A thread that exists before the counter is set up. */
    atomic_int go = 0;
    unsigned char *early_pages = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(early_pages != MAP_FAILED);
    void *args[2] = {&go, early_pages};
    pthread_t early;
    CHECK(pthread_create(&early, NULL, wait_then_touch, args) == 0);
    uint64_t before = 0, after = 0;
    if (getenv("MAPPING_TRACK_FAULT_ENTRIES") || !mapping__test_fault_entries_count(&before)) {
        atomic_store(&go, 1);
        pthread_join(early, NULL);
        CHECK(!mapping__test_fault_entries());
        test_skip("the fault entry counter is not available here (perf refused, or MAPPING_TRACK_FAULT_ENTRIES=off)");
    }
    atomic_store(&go, 1);
    CHECK(pthread_join(early, NULL) == 0);
    CHECK(mapping__test_fault_entries_count(&after));
    CHECK(after - before >= TOUCHED_PAGES);
    /* A thread made after it. */
    unsigned char *late_pages = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(late_pages != MAP_FAILED);
    before = after;
    pthread_t late;
    CHECK(pthread_create(&late, NULL, touch_pages, late_pages) == 0);
    CHECK(pthread_join(late, NULL) == 0);
    CHECK(mapping__test_fault_entries_count(&after));
    CHECK(after - before >= TOUCHED_PAGES);
    munmap(early_pages, n);
    munmap(late_pages, n);
}
