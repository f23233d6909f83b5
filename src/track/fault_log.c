/*
 * The fault log (fault_log.h): a perf software event that samples every
 * minor page fault of one thread with its address, read back at drains and
 * trusted only for intervals in which it provably saw every fault of the
 * process.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "track/fault_count.h"
#include "track/fault_log.h"
#include "os/os.h"
#include "track/write_track.h"

#if defined(__linux__)
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>

enum {
    RING_PAGES = 16,   /* data pages: 4,096 samples of 16 bytes between drains */
    LOG_CAP = 8192,    /* faulted pages kept for regions that drain later */
    SAMPLE_NS = 600,   /* what logging one fault costs (measured 0.4-0.7 us on a VM, Linux 6.18) */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t  open_once = PTHREAD_ONCE_INIT;
static int             event_fd = -1;
static struct perf_event_mmap_page *ring;
static size_t          ring_bytes, page_size;
static const char     *why_not = "not opened";
static _Thread_local bool logging_thread;

static bool     event_on;      /* the event is enabled */
static bool     skip_next;     /* enabled after the last snapshot: the next interval is a gap */
static bool     last_valid;    /* last_faults belongs to a consistent snapshot on the logging thread */
static uint64_t last_faults;
static uint64_t last_entries;  /* mapping_track_fault_entries at the last consistent snapshot */
static bool     last_entries_valid;
static uint64_t drains, gap_drain;
static uint64_t log_length;
static uintptr_t log_pages[LOG_CAP];

static bool wanted(void)
{
    return mapping_track_scan_mode() == MAPPING_TRACK_SCAN_FAULTED;
}

/* fork(): the lock is held across it, so a child never inherits it taken
 * by a thread that does not exist there; the child has no mapping of the
 * parent's ring (the kernel does not copy it), and the event counts the
 * parent's thread, so it never reads it. */
static bool forked;
static bool atfork_ok;

static void before_fork(void)
{
    pthread_mutex_lock(&lock);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&lock);
}

static void after_fork_child(void)
{
    forked = true;
    pthread_mutex_unlock(&lock);
}

/* Registered when the library is loaded, not by the first thread that uses
 * the log: glibc (2.36 and later) runs a fork's prepare handlers without
 * its atfork lock, and a handler registered meanwhile by another thread is
 * left out of that fork: neither its prepare nor its child handler runs. A
 * fork in progress as the first tracked mirror began then made a child that
 * started with `lock` held by a thread it does not have (its first tracked
 * mirror waited forever), or with `forked` unset (it read a ring it has no
 * mapping of). At load, no thread of the program can be inside the library.
 * Priority 201, before write_track.c's (202): prepare handlers run
 * last-registered first, so the tracker's locks are taken before this one,
 * the order every other path takes them in. */
__attribute__((constructor(201))) static void register_fork_handlers(void)
{
    atfork_ok = pthread_atfork(before_fork, after_fork_parent, after_fork_child) == 0;
}

static void fill_attr(struct perf_event_attr *a)
{
    memset(a, 0, sizeof *a);
    a->size = sizeof *a;
    a->type = PERF_TYPE_SOFTWARE;
    a->config = PERF_COUNT_SW_PAGE_FAULTS_MIN;
    a->sample_period = 1;
    a->sample_type = PERF_SAMPLE_ADDR;
    a->exclude_kernel = 1; /* allowed at perf_event_paranoid 2; the kernel's faults make gaps */
    a->exclude_hv = 1;
    a->watermark = 1;      /* nobody polls: wake nobody */
    a->wakeup_watermark = 1u << 30;
}

static const char *open_refused(void)
{
    return errno == EACCES || errno == EPERM ? "perf_event_open refused (kernel.perf_event_paranoid > 2, or a "
                                               "seccomp filter)"
                                             : "perf_event_open failed";
}

/* Opened by the first thread that drains, which becomes the logging thread
 * (once: pthread_once, before `lock` is taken, set_up_unlocked). */
static void open_event(void)
{
    if (!wanted()) {
        why_not = "MAPPING_TRACK_SCAN is not faulted";
        return;
    }
    struct perf_event_attr a;
    fill_attr(&a);
    int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
        why_not = open_refused();
        return;
    }
    page_size = mapping_os_page_size();
    ring_bytes = (RING_PAGES + 1) * page_size;
    void *m = mmap(NULL, ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        why_not = "the perf ring could not be mapped (RLIMIT_MEMLOCK / perf_event_mlock_kb)";
        return;
    }
    if (!atfork_ok) {
        munmap(m, ring_bytes);
        close(fd);
        why_not = "pthread_atfork failed";
        return;
    }
    ring = m;
    event_fd = fd;
    logging_thread = true;
    event_on = true;
    why_not = "";
}

bool mapping_track_fault_log_probe(const char **why)
{
    if (!wanted()) {
        *why = "MAPPING_TRACK_SCAN is not faulted";
        return false;
    }
    struct perf_event_attr a;
    fill_attr(&a);
    a.disabled = 1;
    int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
        *why = open_refused();
        return false;
    }
    close(fd);
    *why = "";
    return true;
}

static bool opened_here(void)
{
    pthread_once(&open_once, open_event);
    return event_fd >= 0 && !forked;
}

/* Copies `bytes` at ring offset `at` (wrapping) to dst. */
static void ring_read(uint64_t at, void *dst, size_t bytes)
{
    const unsigned char *data = (const unsigned char *)ring + page_size; /* the data pages follow the header page */
    uint64_t size = (uint64_t)RING_PAGES * page_size, from = at % size;
    size_t first = from + bytes <= size ? bytes : (size_t)(size - from);
    memcpy(dst, data + from, first);
    memcpy((unsigned char *)dst + first, data, bytes - first);
}

/* Reads the records in [from, to) into the log: how many samples, and
 * whether any other record (lost samples, throttling) says some are missing. */
static uint64_t read_records(uint64_t from, uint64_t to, bool *missing)
{
    uint64_t samples = 0;
    while (from < to) {
        struct perf_event_header h;
        ring_read(from, &h, sizeof h);
        if (h.size < sizeof h)
            break; /* not a record: trust nothing */
        if (h.type == PERF_RECORD_SAMPLE && h.size >= sizeof h + sizeof(uint64_t)) {
            uint64_t addr;
            ring_read(from + sizeof h, &addr, sizeof addr);
            log_pages[log_length++ % LOG_CAP] = (uintptr_t)addr & ~(uintptr_t)(page_size - 1);
            samples++;
        } else {
            *missing = true;
        }
        from += h.size;
    }
    if (from != to)
        *missing = true;
    return samples;
}

/* The process's minor + major fault count (every thread, exited ones too). */
static bool process_faults(uint64_t *out)
{
    struct rusage r;
    if (getrusage(RUSAGE_SELF, &r) != 0)
        return false;
    *out = (uint64_t)r.ru_minflt + (uint64_t)r.ru_majflt;
    return true;
}

/* One drain (under `lock`): the samples since the last one go to the log,
 * and the interval is a gap unless it provably holds every fault. Returns
 * whether *faults_out holds a fault stamp: the process's fault count, plus
 * the faults every thread began (mapping_track_fault_entries) when
 * *every_thread says they are counted. Equal stamps mean that no fault
 * completed, and with *every_thread that none began either: no page became
 * writable, even in another thread's fault still in flight. */
/* Turns the event on for the next interval when its faults cost less to
 * log than a walk (scan_ns), off when more. */
static void steer_event(uint64_t scan_ns, uint64_t faults)
{
    bool want = !scan_ns || (faults - last_faults) * SAMPLE_NS <= scan_ns;
    if (want != event_on && ioctl(event_fd, want ? PERF_EVENT_IOC_ENABLE : PERF_EVENT_IOC_DISABLE, 0) == 0) {
        event_on = want;
        skip_next = want; /* faults between the snapshot and now went unlogged */
    }
}

/* A drain on the logging thread: the ring's samples against the process's
 * fault count (and the faults every thread began). Returns whether the
 * interval provably holds every fault. */
static bool drain_logged(uint64_t scan_ns, uint64_t *faults_out, bool *every_thread, bool *counted)
{
    uint64_t tail = ring->data_tail, entries = 0;
    uint64_t h1 = __atomic_load_n(&ring->data_head, __ATOMIC_ACQUIRE);
    struct rusage r;
    int rc = logging_thread ? getrusage(RUSAGE_SELF, &r) : -1;
    bool have_entries = rc == 0 && mapping_track_fault_entries(&entries);
    uint64_t h2 = __atomic_load_n(&ring->data_head, __ATOMIC_ACQUIRE);
    bool missing = false;
    uint64_t samples = read_records(tail, h2, &missing);
    __atomic_store_n(&ring->data_tail, h2, __ATOMIC_RELEASE);
    bool consistent = rc == 0 && h1 == h2;
    uint64_t faults = rc == 0 ? (uint64_t)r.ru_minflt + (uint64_t)r.ru_majflt : 0;
    *counted = rc == 0 || process_faults(&faults);
    *every_thread = have_entries;
    *faults_out = faults + (have_entries ? entries : 0);
    /* Another thread's fault in flight has begun (counted in entries) but
     * not completed (not in getrusage, nor sampled): without the entries,
     * the counts could agree while its page is writable. */
    bool entries_agree = !have_entries || (last_entries_valid && entries - last_entries == samples);
    bool complete = consistent && last_valid && event_on && !skip_next && !missing && faults - last_faults == samples &&
                    entries_agree;
    last_entries = entries;
    last_entries_valid = consistent && have_entries;
    skip_next = false;
    if (consistent && last_valid)
        steer_event(scan_ns, faults);
    last_valid = consistent;
    last_faults = faults;
    return complete;
}

static bool drain(uint64_t scan_ns, uint64_t *faults_out, bool *every_thread)
{
    drains++;
    bool complete = false, counted = false;
    uint64_t entries = 0;
    *every_thread = false;
    if (!opened_here()) {
        counted = process_faults(faults_out);
        *every_thread = counted && mapping_track_fault_entries(&entries);
        *faults_out += entries;
    } else {
        complete = drain_logged(scan_ns, faults_out, every_thread, &counted);
    }
    if (!complete)
        gap_drain = drains;
    return counted;
}

/* Sets up the event and the entry counter before `lock` is taken (they
 * open perf events and list the threads: no reason to hold it meanwhile). */
static void set_up_unlocked(void)
{
    pthread_once(&open_once, open_event);
    (void)mapping_track_fault_entries_available();
}

bool mapping_track_fault_log_available(const char **why)
{
    set_up_unlocked();
    pthread_mutex_lock(&lock);
    bool ok = opened_here();
    pthread_mutex_unlock(&lock);
    *why = ok ? "" : event_fd >= 0 ? "a forked child does not log its faults" : why_not;
    return ok;
}

void mapping_track_fault_log_mark(mapping_track_fault_pos *now)
{
    uint64_t faults;
    bool every_thread;
    set_up_unlocked();
    pthread_mutex_lock(&lock);
    drain(0, &faults, &every_thread);
    *now = (mapping_track_fault_pos){.drain = drains, .length = log_length};
    pthread_mutex_unlock(&lock);
}

static int compare_pages(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

long mapping_track_fault_log_pages(const mapping_track_fault_pos *since, uintptr_t lo, uintptr_t hi, uintptr_t *pages,
                                size_t cap, uint64_t scan_ns, mapping_track_fault_pos *now, uint64_t *faults,
                                bool *every_thread)
{
    long n = -1;
    uint64_t count = 0;
    set_up_unlocked();
    pthread_mutex_lock(&lock);
    *faults = drain(scan_ns, &count, every_thread) ? count : UINT64_MAX;
    *now = (mapping_track_fault_pos){.drain = drains, .length = log_length};
    if (since->drain && since->drain >= gap_drain && log_length - since->length <= LOG_CAP) {
        n = 0;
        for (uint64_t i = since->length; i < log_length; i++) {
            uintptr_t p = log_pages[i % LOG_CAP];
            if (p < lo || p >= hi)
                continue;
            if ((size_t)n == cap) {
                n = -1;
                break;
            }
            pages[n++] = p;
        }
    }
    pthread_mutex_unlock(&lock);
    if (n > 1) {
        qsort(pages, (size_t)n, sizeof *pages, compare_pages);
        long k = 1;
        for (long i = 1; i < n; i++)
            if (pages[i] != pages[k - 1])
                pages[k++] = pages[i];
        n = k;
    }
    return n;
}


#else /* no perf events: every scan walks */

bool mapping_track_fault_log_probe(const char **why)
{
    *why = "no perf events on this system";
    return false;
}
bool mapping_track_fault_log_available(const char **why)
{
    *why = "no perf events on this system";
    return false;
}
void mapping_track_fault_log_mark(mapping_track_fault_pos *now)
{
    *now = (mapping_track_fault_pos){0, 0};
}
long mapping_track_fault_log_pages(const mapping_track_fault_pos *since, uintptr_t lo, uintptr_t hi, uintptr_t *pages,
                                size_t cap, uint64_t scan_ns, mapping_track_fault_pos *now, uint64_t *faults,
                                bool *every_thread)
{
    (void)since, (void)lo, (void)hi, (void)pages, (void)cap, (void)scan_ns;
    *now = (mapping_track_fault_pos){0, 0};
    *faults = UINT64_MAX;
    *every_thread = false;
    return -1;
}
#endif

mapping_track_scan_kind mapping_track_scan_mode(void)
{
    const char *v = getenv("MAPPING_TRACK_SCAN");
    return !v || !*v || strcmp(v, "faulted") == 0 ? MAPPING_TRACK_SCAN_FAULTED
           : strcmp(v, "changed") == 0          ? MAPPING_TRACK_SCAN_CHANGED
           : strcmp(v, "always") == 0           ? MAPPING_TRACK_SCAN_ALWAYS
                                                : MAPPING_TRACK_SCAN_BAD;
}
