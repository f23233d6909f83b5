/*
 * MAPPING_CHECK=races (race_guard.h): page protection over the host ranges
 * of asynchronous copies, and a SIGSEGV handler that reports the first CPU
 * access racing one of them.
 *
 * Guards live in a fixed table read by the handler without locks (a slot's
 * fields are written before its state is published with a release store).
 * Changes to the table and to the protection are made under one mutex; the
 * protection of a page is always recomputed from every guard on it (the
 * strongest wins: inaccessible, then read-only), so overlapping copies on
 * several streams keep each other's protection. The handler allocates
 * nothing and takes no lock: it formats the report into a stack buffer,
 * write(2)s it to stderr and aborts, like a sanitizer.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include "os/os.h"
#include "track/signal_chain.h"
#include "track/race_guard.h"

_Atomic int mapping__race_mode;

int mapping__race_mode_read(void)
{
    /* MAPPING_CHECK is a comma-separated list; "races" turns this on. */
    const char *v = getenv("MAPPING_CHECK");
    int mode = 1;
    for (const char *p = v; p && *p;) {
        size_t n = strcspn(p, ",");
        if (n == 5 && strncmp(p, "races", 5) == 0)
            mode = 2;
        p += n + (p[n] == ',');
    }
    atomic_store_explicit(&mapping__race_mode, mode, memory_order_relaxed);
    return mode;
}

enum { GUARD_SLOTS = 1024 };
enum { SLOT_FREE = 0, SLOT_READONLY = 1, SLOT_NOACCESS = 2, SLOT_OPEN = 3 /* copying or ending: no check */ };

struct mapping_race_guard {
    _Atomic int       state;
    /* Atomic (each read is one lock-free load): the SIGSEGV handler reads a
     * slot without the lock while another thread may be refilling it. */
    _Atomic uintptr_t lo, hi;     /* page-aligned: the whole pages of the copy, protected (lo == hi: none) */
    _Atomic uintptr_t olo, ohi;   /* the pages the copy touches at all (rounded outward) */
    _Atomic uintptr_t range_lo, range_hi; /* the copy's own host range, for the report */
    _Atomic int       op;
    const void *_Atomic stream;
    const void *_Atomic worker; /* the stream's worker identity (mapping_os_worker_stream on its threads) */
};

_Static_assert(ATOMIC_POINTER_LOCK_FREE == 2 && ATOMIC_LONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "the SIGSEGV handler needs lock-free loads");
static struct mapping_race_guard guards[GUARD_SLOTS];

/* The stream whose host function this thread is running (mapping__launch_host
 * wraps them while the check is on), and the guards of that stream the
 * function's own accesses opened: stream-ordered work, not a race (a
 * function queued before a copy runs before it; one queued after runs after
 * the copy's guard is gone). Re-protected when the function returns.
 * Initial-exec TLS: the handler may read it. */
enum { OPENED_MAX = 16 };
static _Thread_local __attribute__((tls_model("initial-exec"))) const void *in_stream_fn;
static _Thread_local __attribute__((tls_model("initial-exec"))) int opened_slot[OPENED_MAX], opened_state[OPENED_MAX];
static _Thread_local __attribute__((tls_model("initial-exec"))) int n_opened;
static pthread_mutex_t           guards_lock = PTHREAD_MUTEX_INITIALIZER;
/* Non-zero while a guard's protection is being changed (under guards_lock):
 * a fault on an open guard's pages then retries rather than going on. */
static _Atomic int               in_transition;
static pthread_once_t            install_once = PTHREAD_ONCE_INIT;
static mapping_track_sigchain       chain;
static int                       installed;
static size_t                    guard_page; /* the base page, for the handler */
/* The 2 MiB chunks a guard ever protected: where a late fault may come from. */
static mapping_track_fault_history  history;

/* ---- the report (async-signal-safe formatting) ---- */

static size_t put_str(char *b, size_t at, size_t cap, const char *s)
{
    while (*s && at + 1 < cap)
        b[at++] = *s++;
    return at;
}

static size_t put_hex(char *b, size_t at, size_t cap, uintptr_t v)
{
    char tmp[2 + 2 * sizeof v];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    at = put_str(b, at, cap, "0x");
    while (n && at + 1 < cap)
        b[at++] = tmp[--n];
    return at;
}

static int access_is_write(void *ctx)
{
#if defined(__x86_64__) && defined(REG_ERR)
    const ucontext_t *uc = ctx;
    return (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
    (void)ctx;
    return -1;
#endif
}

static void report(const struct mapping_race_guard *g, uintptr_t addr, void *ctx)
{
    char b[768];
    size_t at = 0, cap = sizeof b;
    int w = access_is_write(ctx);
    at = put_str(b, at, cap, "mapping: MAPPING_CHECK=races: a CPU ");
    at = put_str(b, at, cap, w < 0 ? "access" : w ? "write" : "read");
    at = put_str(b, at, cap, " at ");
    at = put_hex(b, at, cap, addr);
    at = put_str(b, at, cap, g->op == MAPPING_RACE_H2D ? " raced an asynchronous host-to-device copy (sync_to_gpu) from "
                                                       : " raced an asynchronous device-to-host copy (sync_to_cpu) into ");
    at = put_str(b, at, cap, "host range [");
    at = put_hex(b, at, cap, g->range_lo);
    at = put_str(b, at, cap, ", ");
    at = put_hex(b, at, cap, g->range_hi);
    at = put_str(b, at, cap, ") queued on stream ");
    at = put_hex(b, at, cap, (uintptr_t)g->stream);
    at = put_str(b, at, cap, g->op == MAPPING_RACE_H2D
                                 ? "; the source must not change until the stream has passed the copy (synchronize "
                                   "the stream or wait for an event first)\n"
                                 : "; the destination must not be touched until the stream has passed the copy "
                                   "(synchronize the stream or wait for an event first)\n");
    ssize_t rc = write(STDERR_FILENO, b, at);
    (void)rc;
}

/* What a fault on guard i's pages by this thread is: the stream's own
 * work (a host function queued on the guard's stream: opened until it
 * returns; the library's work on that stream's threads: opened for good),
 * or a race. Work of another stream, a host function or the library's, is
 * not ordered with the copy: a race, like the program's own threads. */
enum { FAULT_RACE, FAULT_OPEN_FOR_FN, FAULT_OPEN_FOR_GOOD };

static int classify(const struct mapping_race_guard *g)
{
    if (in_stream_fn)
        return in_stream_fn == g->stream ? FAULT_OPEN_FOR_FN : FAULT_RACE;
    const void *worker = mapping_os_worker_stream();
    return worker && worker == g->worker ? FAULT_OPEN_FOR_GOOD : FAULT_RACE;
}

/* Opens guard i for this thread's fault (classify); false: a race. */
static bool open_for(int i, int state)
{
    int kind = classify(&guards[i]);
    if (kind == FAULT_RACE)
        return false;
    int prev = state;
    if (atomic_compare_exchange_strong(&guards[i].state, &prev, SLOT_OPEN) && kind == FAULT_OPEN_FOR_FN &&
        n_opened < OPENED_MAX) {
        opened_slot[n_opened] = i;
        opened_state[n_opened++] = prev;
    }
    mprotect((void *)guards[i].lo, guards[i].hi - guards[i].lo, PROT_READ | PROT_WRITE);
    return true;
}

static void on_segv(int sig, siginfo_t *info, void *ctx)
{
    int saved_errno = errno; /* mprotect below may set it; the program's must stay */
    uintptr_t addr = info ? (uintptr_t)info->si_addr : 0;
    bool open_slot = false, opened = false;
    for (int i = 0; info && info->si_code == SEGV_ACCERR && i < GUARD_SLOTS; i++) {
        int state = atomic_load_explicit(&guards[i].state, memory_order_acquire);
        if (state == SLOT_FREE || addr < guards[i].lo || addr >= guards[i].hi)
            continue;
        if (state == SLOT_OPEN) {
            open_slot = true; /* its protection is being lifted: try again */
            continue;
        }
        if (!open_for(i, state)) {
            report(&guards[i], addr, ctx);
            abort();
        }
        opened = true;
    }
    bool again = opened || (open_slot && atomic_load_explicit(&in_transition, memory_order_acquire));
    /* A late fault: the access faulted on a guard's protection, which was
     * lifted (the copy started or completed, the guard's slot open or free
     * again) before this handler ran, on a thread preempted in between.
     * Its race can no longer be told (the guard may be gone), but it is
     * not the program's fault to pass on (that killed the process with a
     * plain SIGSEGV, or went to the program's handler): run it again when
     * it would pass now. Only on an open guard's pages or near pages a
     * guard once protected, so that other faults go on as without the
     * library. */
    if (!again && info && info->si_code == SEGV_ACCERR &&
        (open_slot || mapping_track_fault_history_has(&history, addr)))
        again = mapping_track_fault_passes_now(info, ctx, guard_page);
    errno = saved_errno;
    if (again)
        return; /* try the access again */
    mapping_track_sigsegv_chain(&chain, sig, info, ctx);
}

static void install(void)
{
    guard_page = mapping_os_page_size();
    installed = mapping_track_sigsegv_install(&chain, on_segv) == 0;
}

/* Recomputes the protection of [lo, hi) from every guard on it. Under guards_lock. */
static void protect_pages(uintptr_t lo, uintptr_t hi)
{
    mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE);
    for (int want = SLOT_READONLY; want <= SLOT_NOACCESS; want++)
        for (int i = 0; i < GUARD_SLOTS; i++) {
            struct mapping_race_guard *g = &guards[i];
            if (atomic_load_explicit(&g->state, memory_order_relaxed) != want || g->hi <= lo || g->lo >= hi)
                continue;
            uintptr_t a = g->lo > lo ? g->lo : lo, b = g->hi < hi ? g->hi : hi;
            mprotect((void *)a, b - a, want == SLOT_NOACCESS ? PROT_NONE : PROT_READ);
        }
}

/* fork(): guards_lock is held across it, so a child never inherits it
 * taken by a thread it does not have (its first checked copy waited
 * forever), nor a change of protection half made (in_transition). The
 * child has none of its parent's queued copies, nor the threads that run
 * them: their guards would never end there, and the child's own accesses
 * to that memory were reported as races with copies it does not have. So
 * the child lifts them all (guards protect only memory that was read-write,
 * as their end does), and forgets what the forking thread had opened. */
static void before_fork(void)
{
    pthread_mutex_lock(&guards_lock);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&guards_lock);
}

static void after_fork_child(void)
{
    for (int i = 0; i < GUARD_SLOTS; i++) {
        struct mapping_race_guard *g = &guards[i];
        if (atomic_load_explicit(&g->state, memory_order_relaxed) == SLOT_FREE)
            continue;
        if (g->lo < g->hi)
            mprotect((void *)g->lo, g->hi - g->lo, PROT_READ | PROT_WRITE);
        atomic_store_explicit(&g->state, SLOT_FREE, memory_order_release);
    }
    n_opened = 0;
    pthread_mutex_unlock(&guards_lock);
}

/* Registered when the library is loaded, not at the first checked copy:
 * glibc (2.36 and later) runs a fork's prepare handlers without its atfork
 * lock, and leaves a handler that another thread registers meanwhile out of
 * that fork (write_track.c). Without them (pthread_atfork failed), as
 * before: no check is given up for it. */
__attribute__((constructor)) static void register_fork_handlers(void)
{
    (void)pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* The whole pages [*lo, *hi) a guard may protect: none (lo == hi == olo,
 * an open record) where mprotect write tracking watches them (they keep
 * its protection), or where the memory is not plain read-write (the
 * guard's end makes its pages read-write again, which would make read-only
 * memory, a const table uploaded, writable, or drop PROT_EXEC, a JIT
 * buffer). guards_lock held: write tracking begins under it too. */
static bool watched(uintptr_t lo, uintptr_t hi);

static void protectable(uintptr_t *lo, uintptr_t *hi, uintptr_t olo)
{
    int exec = 0;
    if (*lo < *hi && watched(*lo, *hi))
        *lo = *hi;
    if (*lo < *hi) {
        int rc = mapping_os_range_access(*lo, *hi, PROT_READ | PROT_WRITE, &exec);
        if ((rc != 0 && rc != -ENOENT) || exec != 0)
            *lo = *hi;
    }
    if (*lo >= *hi) /* nothing to protect, but the copy is recorded (open) for the overlap test below */
        *lo = *hi = olo;
}

mapping_race_guard *mapping__race_guard_begin(const void *ptr, size_t bytes, int op, const void *stream,
                                              const void *worker)
{
    pthread_once(&install_once, install);
    uintptr_t page = mapping_os_page_size(), p = (uintptr_t)ptr;
    if (!installed || p + bytes < p || !bytes)
        return NULL;
    uintptr_t lo = (p + page - 1) & ~(page - 1), hi = (p + bytes) & ~(page - 1);
    uintptr_t olo = p & ~(page - 1), ohi = (p + bytes + page - 1) & ~(page - 1);
    pthread_mutex_lock(&guards_lock);
    protectable(&lo, &hi, olo);
    atomic_fetch_add(&in_transition, 1);
    struct mapping_race_guard *g = NULL;
    /* A page that an earlier copy still uses is not protected again: that
     * copy (which a driver may run with CPU stores, on a thread of its own)
     * comes first in its stream, or in this one through an event, and
     * would trip over this guard before this copy is reached. The pages
     * compared are all those a copy touches, the partly covered ones at its
     * ends included (a copy with no whole page has an open record for
     * this). The guard is kept, open (unprotected), so that later copies
     * of the range see it too, until its copy is done. */
    bool overlap = lo == hi;
    for (int i = 0; i < GUARD_SLOTS && !overlap; i++)
        overlap = atomic_load_explicit(&guards[i].state, memory_order_relaxed) != SLOT_FREE && guards[i].olo < ohi &&
                  olo < guards[i].ohi;
    for (int i = 0; i < GUARD_SLOTS && !g; i++)
        if (atomic_load_explicit(&guards[i].state, memory_order_relaxed) == SLOT_FREE)
            g = &guards[i];
    if (g) {
        g->lo = lo;
        g->hi = hi;
        g->olo = olo;
        g->ohi = ohi;
        g->range_lo = p;
        g->range_hi = p + bytes;
        g->op = op;
        g->stream = stream;
        g->worker = worker;
        atomic_store_explicit(&g->state, overlap ? SLOT_OPEN : op == MAPPING_RACE_H2D ? SLOT_READONLY : SLOT_NOACCESS,
                              memory_order_release);
        if (!overlap) {
            mapping_track_fault_history_add(&history, lo, hi);
            protect_pages(lo, hi);
        }
    }
    atomic_fetch_sub(&in_transition, 1);
    pthread_mutex_unlock(&guards_lock);
    return g;
}

void mapping__race_guard_started(void *guard)
{
    struct mapping_race_guard *g = guard;
    if (!g)
        return;
    pthread_mutex_lock(&guards_lock);
    atomic_fetch_add(&in_transition, 1);
    atomic_store_explicit(&g->state, SLOT_OPEN, memory_order_release);
    protect_pages(g->lo, g->hi);
    atomic_fetch_sub(&in_transition, 1);
    pthread_mutex_unlock(&guards_lock);
}

void mapping__race_guard_end(void *guard)
{
    struct mapping_race_guard *g = guard;
    if (!g)
        return;
    pthread_mutex_lock(&guards_lock);
    atomic_fetch_add(&in_transition, 1);
    atomic_store_explicit(&g->state, SLOT_OPEN, memory_order_release); /* faults meanwhile retry */
    protect_pages(g->lo, g->hi);
    atomic_store_explicit(&g->state, SLOT_FREE, memory_order_release);
    atomic_fetch_sub(&in_transition, 1);
    pthread_mutex_unlock(&guards_lock);
}

void mapping__race_stream_fn_enter(const void *stream)
{
    in_stream_fn = stream;
    n_opened = 0;
}

void mapping__race_stream_fn_leave(void)
{
    in_stream_fn = NULL;
    if (!n_opened)
        return;
    pthread_mutex_lock(&guards_lock);
    atomic_fetch_add(&in_transition, 1);
    for (int k = 0; k < n_opened; k++) {
        struct mapping_race_guard *g = &guards[opened_slot[k]];
        int open = SLOT_OPEN;
        if (atomic_compare_exchange_strong(&g->state, &open, opened_state[k]))
            protect_pages(g->lo, g->hi);
    }
    n_opened = 0;
    atomic_fetch_sub(&in_transition, 1);
    pthread_mutex_unlock(&guards_lock);
}

/* ---- write tracking beside the guards ---- */

void mapping__race_guards_lock(void)
{
    pthread_mutex_lock(&guards_lock);
}

void mapping__race_guards_unlock(void)
{
    pthread_mutex_unlock(&guards_lock);
}

/* The ranges mprotect write tracking watches (under guards_lock): their
 * pages keep the tracker's protection, never a guard's. */
static uintptr_t (*watch)[2];
static size_t     n_watch, cap_watch;

static bool watched(uintptr_t lo, uintptr_t hi)
{
    for (size_t i = 0; i < n_watch; i++)
        if (watch[i][0] < hi && lo < watch[i][1])
            return true;
    return false;
}

int mapping__race_guards_watch_locked(uintptr_t lo, uintptr_t hi)
{
    if (n_watch == cap_watch) {
        size_t cap = cap_watch ? 2 * cap_watch : 16;
        uintptr_t(*v)[2] = mapping_os_realloc(watch, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        watch = v;
        cap_watch = cap;
    }
    watch[n_watch][0] = lo;
    watch[n_watch++][1] = hi;
    mapping__race_guards_yield_locked(lo, hi);
    return 0;
}

void mapping__race_guards_unwatch_locked(uintptr_t lo, uintptr_t hi)
{
    for (size_t i = 0; i < n_watch; i++)
        if (watch[i][0] == lo && watch[i][1] == hi) {
            watch[i][0] = watch[--n_watch][0];
            watch[i][1] = watch[n_watch][1];
            return;
        }
}

void mapping__race_guards_yield_locked(uintptr_t lo, uintptr_t hi)
{
    atomic_fetch_add(&in_transition, 1);
    for (int i = 0; i < GUARD_SLOTS; i++) {
        struct mapping_race_guard *g = &guards[i];
        if (atomic_load_explicit(&g->state, memory_order_relaxed) == SLOT_FREE || g->lo >= g->hi || g->hi <= lo ||
            g->lo >= hi)
            continue;
        uintptr_t was_lo = g->lo, was_hi = g->hi;
        atomic_store_explicit(&g->state, SLOT_OPEN, memory_order_release);
        g->lo = g->hi = g->olo; /* an open record from now on: its end protects nothing */
        protect_pages(was_lo, was_hi);
    }
    atomic_fetch_sub(&in_transition, 1);
}

/* The protected ranges of the guards meeting [lo, hi), sorted; guards_lock held. */
static int guarded_ranges(uintptr_t lo, uintptr_t hi, uintptr_t (*out)[2], int cap)
{
    int n = 0;
    for (int i = 0; i < GUARD_SLOTS && n < cap; i++) {
        const struct mapping_race_guard *g = &guards[i];
        if (atomic_load_explicit(&g->state, memory_order_relaxed) == SLOT_FREE || g->lo >= g->hi || g->hi <= lo ||
            g->lo >= hi)
            continue;
        int k = n++;
        for (; k > 0 && out[k - 1][0] > g->lo; k--) {
            out[k][0] = out[k - 1][0];
            out[k][1] = out[k - 1][1];
        }
        out[k][0] = g->lo;
        out[k][1] = g->hi;
    }
    return n;
}

int mapping__race_guards_range_access_locked(uintptr_t lo, uintptr_t hi, int prot, int *exec)
{
    static uintptr_t ranges[GUARD_SLOTS][2]; /* guards_lock held */
    int n = guarded_ranges(lo, hi, ranges, GUARD_SLOTS), rc = 0;
    if (!n)
        return mapping_os_range_access(lo, hi, prot, exec);
    /* Guarded pages were plain read-write memory when protected (and are
     * again at the guard's end): only the pages between them are asked. */
    for (int k = 0; k <= n && (rc == 0 || rc == -ENOENT); k++) {
        uintptr_t a = k ? ranges[k - 1][1] : lo, b = k < n ? ranges[k][0] : hi;
        a = a > lo ? a : lo;
        b = b < hi ? b : hi;
        if (a < b)
            rc = mapping_os_range_access(a, b, prot, NULL);
    }
    if (exec)
        *exec = 0;
    return rc;
}

int mapping__race_guards_range_access(uintptr_t lo, uintptr_t hi, int prot)
{
    pthread_mutex_lock(&guards_lock);
    int rc = mapping__race_guards_range_access_locked(lo, hi, prot, NULL);
    pthread_mutex_unlock(&guards_lock);
    return rc;
}
