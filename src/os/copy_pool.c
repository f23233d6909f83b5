/*
 * Large memcpys split over a few threads (os.h: mapping_os_copy_parallel).
 *
 * Why: a copy of pageable memory to or from a device goes through
 * page-locked staging memory, and on a GPU the memcpy into (or out of) the
 * staging memory is the slowest step by far: one core copies 7-10 GB/s
 * from DRAM where the link moves 55 GB/s (an H200 on PCIe 5, BENCHMARKS.md).
 * Several cores together copy several times faster.
 *
 * How: a copy of at least PARALLEL_MIN bytes is cut into parts of at least
 * PART_MIN bytes, at most one per helper thread plus one. The caller puts
 * the copy on a list, wakes the helpers and copies parts itself; every
 * thread takes the next part not yet taken, so a copy finishes even when
 * every helper is busy with another caller's copy (the caller then copies
 * all of it). The caller returns once every part is done: the helpers touch
 * the copy (on the caller's stack) only before they count their part done,
 * under the pool's lock.
 *
 * The helpers are made on the first large copy, as many as
 * $MAPPING_COPY_THREADS says (mapping_os_copy_threads_from_env; by default
 * half the CPUs less one, at most 5: none on a 2-core machine), block every
 * signal a program might direct at the process, and live until the library
 * is unloaded (dlclose) or the process exits: the library's destructor
 * stops and joins them, as their code goes with the library, and copies
 * after that are the caller's alone. A forked child starts without them
 * (pthread_atfork) and makes its own on its first large copy.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "os/os.h"

enum { HELPERS_MAX = 64 };
static const size_t PARALLEL_MIN = (size_t)2 << 20; /* below this, one memcpy: waking threads costs more */
static const size_t PART_MIN = (size_t)512 << 10;

typedef struct copy_job {
    unsigned char       *dst;
    const unsigned char *src;
    size_t               bytes, part;    /* part: bytes per part, a multiple of 64 */
    int                  parts, next;    /* next: the first part not taken */
    int                  done;           /* parts copied */
    struct copy_job     *next_job;
} copy_job;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t  work_ready = PTHREAD_COND_INITIALIZER; /* a job has parts to take */
static pthread_cond_t  part_done = PTHREAD_COND_INITIALIZER;  /* a part of some job is done */
static copy_job       *jobs;           /* jobs with parts not yet taken */
static pthread_t       helper_ids[HELPERS_MAX];
static int             helpers;        /* helper threads running (helper_ids[0..helpers)) */
static int             stopping;       /* the library is going: helpers return, none is made */
static _Atomic int     wanted = -1;    /* helpers to have (-1: not set yet); read without the lock */
static int             start_failed;   /* pthread_create failed once: no more tries */

/* The job's part i. */
static void copy_part(copy_job *j, int i)
{
    size_t at = (size_t)i * j->part, len = j->bytes - at < j->part ? j->bytes - at : j->part;
    memcpy(j->dst + at, j->src + at, len);
}

/* Takes the next part of the first job that has one, or returns -1. Under the lock. */
static int take_part(copy_job **out)
{
    copy_job *j = jobs;
    if (!j)
        return -1;
    int i = j->next++;
    if (j->next == j->parts)
        jobs = j->next_job; /* every part taken: off the list */
    *out = j;
    return i;
}

static void *helper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&pool_lock);
    for (;;) {
        copy_job *j;
        int i = take_part(&j);
        if (i < 0 && stopping)
            break;
        if (i < 0) {
            pthread_cond_wait(&work_ready, &pool_lock);
            continue;
        }
        pthread_mutex_unlock(&pool_lock);
        copy_part(j, i);
        pthread_mutex_lock(&pool_lock);
        if (++j->done == j->parts)
            pthread_cond_broadcast(&part_done); /* the last touch of j */
    }
    pthread_mutex_unlock(&pool_lock);
    return NULL;
}

/* When the library is unloaded or the process exits: the helpers finish the
 * part they copy, then return, and are joined (a copy under way finishes
 * its other parts on its caller). Not in a forked child's helpers' stead:
 * it has none of its parent's. */
__attribute__((destructor)) static void stop_helpers(void)
{
    pthread_mutex_lock(&pool_lock);
    stopping = 1;
    int n = helpers;
    helpers = 0;
    pthread_cond_broadcast(&work_ready);
    pthread_mutex_unlock(&pool_lock);
    for (int i = 0; i < n; i++)
        pthread_join(helper_ids[i], NULL);
}

/* A forked child has none of the parent's helpers, and the lock may have
 * been held by a thread that is not in the child: start over. */
static void in_child(void)
{
    pthread_mutex_t fresh_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t  fresh_cond = PTHREAD_COND_INITIALIZER;
    pool_lock = fresh_lock;
    work_ready = fresh_cond;
    part_done = fresh_cond;
    jobs = NULL;
    helpers = 0; /* the parent's are not here: nothing to join */
    start_failed = 0;
}

/*
 * Registered when the library loads, not on first use: glibc (2.36 and
 * later) runs a fork's prepare handlers without its atfork lock, and a
 * handler another thread registers meanwhile is left out of that fork
 * (neither prepare nor child handler runs; track/write_track.c).
 */
__attribute__((constructor)) static void register_atfork(void)
{
    pthread_atfork(NULL, NULL, in_child);
}

int mapping_os_copy_threads_default(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long n = cpus > 0 ? cpus / 2 - 1 : 0;
    return n < 0 ? 0 : n > 5 ? 5 : (int)n;
}

bool mapping_os_copy_threads_from_env(int *out)
{
    const char *v = getenv("MAPPING_COPY_THREADS");
    *out = mapping_os_copy_threads_default();
    if (!v || !*v)
        return true;
    int n = 0;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9' || n > HELPERS_MAX)
            return false;
        n = n * 10 + (*p - '0');
    }
    if (n > HELPERS_MAX)
        return false;
    *out = n;
    return true;
}

void mapping_os_copy_threads_set(int n)
{
    atomic_store_explicit(&wanted, n < 0 ? 0 : n > HELPERS_MAX ? HELPERS_MAX : n, memory_order_relaxed);
}

int mapping_os_copy_threads(void)
{
    int n = atomic_load_explicit(&wanted, memory_order_relaxed);
    if (n < 0) { /* no mapping_open yet: the environment, or none when it is refused */
        if (!mapping_os_copy_threads_from_env(&n))
            n = 0;
        int unset = -1;
        if (!atomic_compare_exchange_strong(&wanted, &unset, n))
            n = unset;
    }
    return n;
}

/* Starts helpers up to `want`. Under the lock. */
static void start_helpers(int want)
{
    if (helpers >= want || start_failed || stopping)
        return;
    /* Signals a program directs at the process go to its own threads, not
     * these; faults (a tracked page) reach the library's handlers
     * (mapping_os_thread_create). */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    size_t stack = (size_t)256 << 10; /* a memcpy needs little; sanitizers' runtimes want some */
    if (stack < (size_t)PTHREAD_STACK_MIN)
        stack = (size_t)PTHREAD_STACK_MIN;
    pthread_attr_setstacksize(&attr, stack);
    while (helpers < want) {
        if (mapping_os_thread_create(&helper_ids[helpers], &attr, helper_main, NULL) != 0) {
            start_failed = 1; /* the copies go on with the helpers there are */
            break;
        }
        helpers++;
    }
    pthread_attr_destroy(&attr);
}

void mapping_os_copy_parallel(void *dst, const void *src, size_t bytes)
{
    if (bytes < PARALLEL_MIN) {
        memcpy(dst, src, bytes);
        return;
    }
    int want = mapping_os_copy_threads();
    pthread_mutex_lock(&pool_lock);
    start_helpers(want);
    int threads = (helpers < want ? helpers : want) + 1;
    size_t most = bytes / PART_MIN;
    int parts = most < (size_t)threads ? (int)most : threads;
    if (parts < 2) {
        pthread_mutex_unlock(&pool_lock);
        memcpy(dst, src, bytes);
        return;
    }
    copy_job j = {.dst = dst, .src = src, .bytes = bytes, .parts = parts};
    j.part = (bytes / (size_t)parts + 63) / 64 * 64;
    /* A part size rounded up may leave the last parts empty: fewer parts. */
    j.parts = (int)((bytes + j.part - 1) / j.part);
    copy_job **last = &jobs;
    while (*last)
        last = &(*last)->next_job;
    *last = &j;
    pthread_cond_broadcast(&work_ready);
    /* The caller copies too: its own job's parts while any are left. */
    while (j.next < j.parts) {
        int i = j.next++;
        if (j.next == j.parts) { /* every part taken: off the list */
            for (copy_job **p = &jobs; *p; p = &(*p)->next_job)
                if (*p == &j) {
                    *p = j.next_job;
                    break;
                }
        }
        pthread_mutex_unlock(&pool_lock);
        copy_part(&j, i);
        pthread_mutex_lock(&pool_lock);
        j.done++;
    }
    while (j.done < j.parts)
        pthread_cond_wait(&part_done, &pool_lock);
    pthread_mutex_unlock(&pool_lock);
}
