/*
 * Write tracking by mprotect and a SIGSEGV handler (write_track.h), for
 * kernels without userfaultfd async write-protect.
 *
 * A tracked region is PROT_READ. The first write to a page faults; the
 * handler finds the region in a fixed table without locks (slots published
 * with release stores, read with acquire loads), makes the page writable
 * (a run of pages after a sequential streak: widened_run), then sets their
 * bits in the region's bitmap and bumps the region's dirty count. Everything in the handler is async-signal-safe: atomics and
 * mprotect(2), no allocation, no lock; errno is kept. A fault outside every
 * region goes on as the kernel would have delivered it without the library
 * (signal_chain.h: to the handler installed before ours, with its mask and
 * flags, or the default action), except a late one: a write that faulted
 * on a region that ended before the handler ran (ended_lately, and
 * mapping_track_fault_passes_now) is run again.
 *
 * Orders that keep a page's bit and its protection consistent when a write
 * races a collect: the handler unprotects before it sets the bit; collect
 * takes the bits (exchange with 0) before it protects again. Either way a
 * page ends up protected with its bit clear, or writable with its bit set
 * (a write that lands between is copied by the sync that collected it).
 * A collect first waits for the handlers that may have opened pages
 * before it to set their bits (wait_for_openers): a write through a page
 * another thread's fault opened, made before the sync, is in it.
 * Removing a region waits until no handler is running (an entry count),
 * so its bitmap is never freed under a handler.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include "os/os.h"
#include "track/signal_chain.h"
#include "track/write_track.h"

enum { MPROT_SLOTS = MAPPING_TRACK_MPROT_SLOTS };

typedef struct mprot_slot {
    _Atomic uintptr_t lo, hi;           /* hi == 0: free (published last, cleared first) */
    _Atomic(_Atomic uint64_t *) bits;   /* one bit per page */
    _Atomic size_t dirty;               /* a hint: 0 means no bit was set since the last collect */
    _Atomic int    exec;                /* PROT_EXEC when the memory is executable (kept), else 0 */
    /* Handlers between making pages writable and setting their bits, by
     * the parity of `epoch` they entered at (see wait_for_openers). */
    _Atomic unsigned epoch;
    _Atomic unsigned opening[2];
} mprot_slot;

static mprot_slot        slots[MPROT_SLOTS];

/* A region's protections, tracked (read-only) and written (read-write):
 * executable memory stays executable (write_track.c refuses a region that
 * is executable only in part, and one that was not read-write). */
#define RO(t) (PROT_READ | (t)->prot_exec)
#define RW(t) (PROT_READ | PROT_WRITE | (t)->prot_exec)
static _Atomic int       in_handler;
static mapping_track_sigchain chain;
/* The 2 MiB chunks any region ever covered: where a late fault may come
 * from (on_segv). */
static mapping_track_fault_history history;
static pthread_once_t    install_once = PTHREAD_ONCE_INIT;
static int               install_rc;
static size_t            page_size;
/* Tests only ($MAPPING_TRACK_TEST_OPEN_DELAY_US, read at install): the
 * handler waits this long between opening pages and setting their bits,
 * so that a test can sync inside that window every time. */
static uint64_t          open_delay_ns;

static void open_delay(void)
{
    struct timespec t0, t;
    if (!open_delay_ns || clock_gettime(CLOCK_MONOTONIC, &t0) != 0)
        return;
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((uint64_t)(t.tv_sec - t0.tv_sec) * 1000000000u + (uint64_t)t.tv_nsec - (uint64_t)t0.tv_nsec < open_delay_ns);
}

/* Sequential writes (a memset, a read(2) into the array) would fault once
 * per page. When the pages just below the faulting one were written since
 * the last collect (their bits are set), the handler opens as many pages
 * again from the faulting one (1, 1, 2, 4, ... up to WIDEN_MAX), counted
 * written: a streaming write of n pages takes about log2(WIDEN_MAX) +
 * n / WIDEN_MAX faults, and a sync may move up to twice what the stream
 * wrote past its last fault. An isolated write still opens one page.
 * A run of a huge page or more ends on a huge-page boundary (HUGE_BYTES),
 * so the runs after it start and end on one: on memory backed by
 * transparent huge pages, opening and protecting them again changes one
 * page-directory entry per 2 MiB instead of 512 page-table entries, and
 * splits no huge page (measured: 1 GiB protected in 0.08 ms against 25-40
 * ms in 4 KiB pages, where changing the entries cost as much as the memset). */
enum { WIDEN_MAX = 4096, HUGE_BYTES = 2 << 20 };

static size_t widened_run(_Atomic uint64_t *bits, uintptr_t lo, size_t p, size_t pages)
{
    size_t streak = 0;
    while (streak < WIDEN_MAX && streak < p) {
        size_t q = p - 1 - streak;
        if (!(atomic_load_explicit(&bits[q / 64], memory_order_relaxed) & ((uint64_t)1 << (q % 64))))
            break;
        streak++;
    }
    size_t run = streak ? streak : 1;
    if (run * page_size >= HUGE_BYTES) { /* to the next huge-page boundary */
        uintptr_t end = lo + (p + run) * page_size;
        end = (end + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1);
        run = (end - lo) / page_size - p;
    }
    return run < pages - p ? run : pages - p;
}

/* A handler makes pages writable before it sets their bits (so a collect
 * between never protects a page whose bit it then leaves set, or the other
 * way round). But once a page is writable, another thread may write it
 * without a fault and then (through a lock, a flag) have a sync run; that
 * sync must carry the write, so its collect waits until every handler that
 * may have opened pages has set their bits. Handlers count themselves in
 * by the parity of the slot's epoch; a collect moves the epoch on, then
 * waits for the handlers counted at the old parity only: new ones count
 * at the new parity, so a stream of faults cannot keep a collect waiting.
 * A handler that sees the epoch move while it counts itself in counts
 * again at the new parity (the collect may not have seen it). */
static unsigned opener_enter(mprot_slot *s)
{
    for (;;) {
        unsigned e = atomic_load(&s->epoch) & 1;
        atomic_fetch_add(&s->opening[e], 1);
        if ((atomic_load(&s->epoch) & 1) == e)
            return e;
        atomic_fetch_sub(&s->opening[e], 1);
    }
}

static void opener_leave(mprot_slot *s, unsigned e)
{
    atomic_fetch_sub_explicit(&s->opening[e], 1, memory_order_release);
}

static void wait_for_openers(mprot_slot *s)
{
    unsigned e = atomic_fetch_add(&s->epoch, 1) & 1;
    while (atomic_load(&s->opening[e]))
        sched_yield();
}

static bool open_pages(mprot_slot *s, uintptr_t addr, uintptr_t lo, uintptr_t hi);

static bool handle(uintptr_t addr)
{
    for (int i = 0; i < MPROT_SLOTS; i++) {
        uintptr_t hi = atomic_load_explicit(&slots[i].hi, memory_order_acquire);
        if (!hi || addr >= hi)
            continue;
        uintptr_t lo = atomic_load_explicit(&slots[i].lo, memory_order_relaxed);
        if (addr < lo)
            continue;
        unsigned e = opener_enter(&slots[i]);
        bool ok = open_pages(&slots[i], addr, lo, hi);
        opener_leave(&slots[i], e);
        return ok;
    }
    return false;
}

/* The fault at addr, in the slot's region [lo, hi): opens its page (or a
 * run, widened_run), then sets their bits. */
static bool open_pages(mprot_slot *s, uintptr_t addr, uintptr_t lo, uintptr_t hi)
{
    _Atomic uint64_t *bits = atomic_load_explicit(&s->bits, memory_order_relaxed);
    int rw = PROT_READ | PROT_WRITE | atomic_load_explicit(&s->exec, memory_order_relaxed);
    size_t p = (addr - lo) / page_size, run = widened_run(bits, lo, p, (hi - lo) / page_size);
    uintptr_t page = lo + p * page_size;
    if (run > 1 && mprotect((void *)page, run * page_size, rw) != 0)
        run = 1;
    if (run == 1 && mprotect((void *)page, page_size, rw) != 0) {
        /* Out of mappings (vm.max_map_count: each protected island is
         * one): the whole region becomes writable and counts as written. */
        if (mprotect((void *)lo, hi - lo, rw) != 0)
            return false;
        for (size_t w = 0, words = ((hi - lo) / page_size + 63) / 64; w < words; w++)
            atomic_store_explicit(&bits[w], ~(uint64_t)0, memory_order_release);
    }
    open_delay();
    for (size_t q = p, end = p + run; q < end;) { /* the run's bits, a word at a time */
        size_t n = 64 - q % 64 < end - q ? 64 - q % 64 : end - q;
        uint64_t mask = (n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1)) << (q % 64);
        atomic_fetch_or_explicit(&bits[q / 64], mask, memory_order_release);
        q += n;
    }
    atomic_fetch_add_explicit(&s->dirty, 1, memory_order_release);
    return true;
}

/* Regions ended lately. A write can fault on a page of a region that is
 * being ended: mapping__mprot_end makes the region writable, then frees its
 * slot, and a handler that looks after that finds no region, though the
 * fault was ours and the page is writable now. A fault in a region ended
 * lately is retried (the handler returns, the write runs again) instead of
 * going to the program's handler, at most RETRIES times per record, so a
 * genuine crash there (the program protected the memory itself since) is
 * still passed on after a few microseconds. The records are a ring: a
 * thread preempted between its fault and the handler for longer than it
 * takes ENDED_RECORDS regions to end finds none; on_segv then asks whether
 * the write would pass now (mapping_track_fault_passes_now). */
enum { ENDED_RECORDS = 16, RETRIES = 1024 };

typedef struct ended_record {
    _Atomic uintptr_t lo, hi;
    _Atomic unsigned  retries;
} ended_record;

static ended_record    ended[ENDED_RECORDS];
static _Atomic unsigned ended_next;

static void remember_ended(uintptr_t lo, uintptr_t hi)
{
    ended_record *r = &ended[atomic_fetch_add_explicit(&ended_next, 1, memory_order_relaxed) % ENDED_RECORDS];
    atomic_store_explicit(&r->hi, 0, memory_order_release);
    atomic_store_explicit(&r->lo, lo, memory_order_relaxed);
    atomic_store_explicit(&r->retries, 0, memory_order_relaxed);
    atomic_store_explicit(&r->hi, hi, memory_order_release);
}

static bool ended_lately(uintptr_t addr)
{
    for (int i = 0; i < ENDED_RECORDS; i++) {
        ended_record *r = &ended[i];
        uintptr_t hi = atomic_load_explicit(&r->hi, memory_order_acquire);
        if (!hi || addr >= hi || addr < atomic_load_explicit(&r->lo, memory_order_relaxed))
            continue;
        return atomic_fetch_add_explicit(&r->retries, 1, memory_order_relaxed) < RETRIES;
    }
    return false;
}

static void on_segv(int sig, siginfo_t *info, void *ctx)
{
    int saved = errno;
    /* Counted in before looking at the slots, and ordered before those
     * loads (a store-load pair with end's: both sides need a full fence,
     * release/acquire lets each miss the other's store): either end sees
     * this count and waits before freeing the bits, or this handler sees
     * the slot empty (and the ended record). */
    atomic_fetch_add_explicit(&in_handler, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    bool accerr = info && info->si_code == SEGV_ACCERR;
    bool ours = accerr && (handle((uintptr_t)info->si_addr) || ended_lately((uintptr_t)info->si_addr));
    atomic_fetch_sub_explicit(&in_handler, 1, memory_order_acq_rel);
    /* A late fault the ended records no longer hold (a thread preempted
     * between its fault and this handler while more regions ended than
     * they keep): the region ended, its pages are writable, and the write
     * passes if run again. Only near memory ever tracked, so that other
     * faults reach the program's handler as without the library. */
    if (!ours && accerr && mapping_track_fault_history_has(&history, (uintptr_t)info->si_addr))
        ours = mapping_track_fault_passes_now(info, ctx, page_size);
    errno = saved;
    if (!ours)
        mapping_track_sigsegv_chain(&chain, sig, info, ctx);
}

/* fork(): a thread inside the handler does not exist in the child, but
 * its counts do (in_handler, a slot's openers): the child's end and
 * collect would wait for it forever. And the pages it had made writable
 * may lack their bits. So the child starts with no handler running, and a
 * region that had one opening pages counts as written in full (reported
 * at the child's next collect, and protected again). */
static void after_fork_child(void)
{
    for (int i = 0; i < MPROT_SLOTS; i++) {
        mprot_slot *s = &slots[i];
        uintptr_t lo = atomic_load(&s->lo), hi = atomic_load(&s->hi);
        _Atomic uint64_t *bits = atomic_load(&s->bits);
        if (hi && bits && (atomic_load(&s->opening[0]) || atomic_load(&s->opening[1]))) {
            for (size_t w = 0, words = ((hi - lo) / page_size + 63) / 64; w < words; w++)
                atomic_store(&bits[w], ~(uint64_t)0);
            atomic_fetch_add(&s->dirty, 1);
        }
        atomic_store(&s->opening[0], 0);
        atomic_store(&s->opening[1], 0);
    }
    atomic_store(&in_handler, 0);
}

/* Registered when the library loads, not at the first tracked mirror:
 * glibc (2.36 and later) leaves a handler another thread registers during
 * a fork out of that fork (write_track.c). */
static bool atfork_ok;
__attribute__((constructor)) static void register_fork_handler(void)
{
    atfork_ok = pthread_atfork(NULL, NULL, after_fork_child) == 0;
}

static void install(void)
{
    page_size = mapping_os_page_size();
    const char *delay = getenv("MAPPING_TRACK_TEST_OPEN_DELAY_US"); /* tests only (README) */
    char *end = NULL;
    unsigned long long us = delay && *delay >= '0' && *delay <= '9' ? strtoull(delay, &end, 10) : 0;
    open_delay_ns = end && !*end && us <= 1000000u ? us * 1000u : 0;
    install_rc = !atfork_ok ? -ENOMEM : mapping_track_sigsegv_install(&chain, on_segv);
}

int mapping__mprot_probe(const char **why)
{
    *why = "";
    return 0; /* installed on first use: a process that never tracks keeps its handlers untouched */
}

int mapping__mprot_begin(mapping_track_region *t)
{
    pthread_once(&install_once, install);
    if (install_rc)
        return install_rc;
    int free_slot = -1;
    for (int i = 0; i < MPROT_SLOTS && free_slot < 0; i++)
        if (!atomic_load_explicit(&slots[i].hi, memory_order_acquire) && !atomic_load(&slots[i].bits))
            free_slot = i;
    if (free_slot < 0)
        return -ENOSPC;
    size_t pages = (t->hi - t->lo) / page_size;
    _Atomic uint64_t *bits = mapping_os_calloc((pages + 63) / 64, sizeof *bits);
    if (!bits)
        return -ENOMEM;
    mprot_slot *s = &slots[free_slot];
    mapping_track_fault_history_add(&history, t->lo, t->hi);
    atomic_store_explicit(&s->bits, bits, memory_order_relaxed);
    atomic_store_explicit(&s->dirty, 0, memory_order_relaxed);
    atomic_store_explicit(&s->exec, t->prot_exec, memory_order_relaxed);
    atomic_store_explicit(&s->lo, t->lo, memory_order_relaxed);
    atomic_store_explicit(&s->hi, t->hi, memory_order_release);
    int rc = 0;
    if (mprotect((void *)t->lo, t->hi - t->lo, RO(t)) != 0)
        rc = -errno;
    else if (mprotect((void *)t->lo, page_size, RW(t)) != 0)
        rc = errno == EINVAL ? -EOPNOTSUPP : -errno; /* a page larger than the base page (hugetlbfs) */
    else if (mprotect((void *)t->lo, page_size, RO(t)) != 0)
        rc = -errno;
    if (rc) {
        mprotect((void *)t->lo, t->hi - t->lo, RW(t));
        atomic_store_explicit(&s->hi, 0, memory_order_seq_cst);
        atomic_thread_fence(memory_order_seq_cst); /* see on_segv */
        while (atomic_load_explicit(&in_handler, memory_order_seq_cst))
            sched_yield();
        atomic_store(&s->bits, NULL);
        free(bits);
        return rc;
    }
    t->slot = free_slot;
    return 0;
}

void mapping__mprot_end(mapping_track_region *t)
{
    mprot_slot *s = &slots[t->slot];
    mprotect((void *)t->lo, t->hi - t->lo, RW(t));
    remember_ended(t->lo, t->hi); /* before the slot goes: a handler finds one or the other */
    atomic_store_explicit(&s->hi, 0, memory_order_seq_cst);
    /* A store then a load: without a full fence the load may pass the
     * store (x86's store buffer), so that this sees no handler while a
     * handler that just counted itself in still sees the slot, and opens
     * pages with bits freed below (see on_segv). */
    atomic_thread_fence(memory_order_seq_cst);
    while (atomic_load_explicit(&in_handler, memory_order_seq_cst))
        sched_yield();
    _Atomic uint64_t *bits = atomic_exchange(&s->bits, NULL);
    free((void *)bits);
}

/* Protects pages [p, e) of the region again and reports them written. If
 * they cannot be protected (out of mappings), they stay writable and
 * counted written: reported again at the next collect, never lost. */
static void report_run(const mapping_track_region *t, mprot_slot *s, _Atomic uint64_t *bits, size_t p, size_t e,
                       mapping_track_fn fn, void *user)
{
    uintptr_t a = t->lo + p * page_size, b = t->lo + e * page_size;
    if (mprotect((void *)a, b - a, RO(t)) != 0) {
        mprotect((void *)a, b - a, RW(t)); /* a part may have been protected */
        for (size_t q = p; q < e; q++)
            atomic_fetch_or_explicit(&bits[q / 64], (uint64_t)1 << (q % 64), memory_order_release);
        atomic_fetch_add_explicit(&s->dirty, 1, memory_order_release);
    }
    fn(user, a, b);
}

int mapping__mprot_collect(mapping_track_region *t, mapping_track_fn fn, void *user)
{
    mprot_slot *s = &slots[t->slot];
    wait_for_openers(s); /* pages opened before this call have their bits */
    if (!atomic_exchange_explicit(&s->dirty, 0, memory_order_acq_rel))
        return 0; /* the clean case: O(1) */
    _Atomic uint64_t *bits = atomic_load_explicit(&s->bits, memory_order_relaxed);
    size_t pages = (t->hi - t->lo) / page_size, words = (pages + 63) / 64;
    size_t run_lo = 0, run_hi = 0; /* pages [run_lo, run_hi) written, not yet reported */
    for (size_t w = 0; w < words; w++) {
        if (!atomic_load_explicit(&bits[w], memory_order_relaxed))
            continue;
        uint64_t v = atomic_exchange_explicit(&bits[w], 0, memory_order_acq_rel);
        while (v) {
            size_t p = w * 64 + (size_t)__builtin_ctzll(v);
            v &= v - 1;
            if (p >= pages)
                break; /* the bits past the end set by the fallback above */
            if (p == run_hi && run_hi > run_lo) {
                run_hi++;
                continue;
            }
            if (run_hi > run_lo)
                report_run(t, s, bits, run_lo, run_hi, fn, user);
            run_lo = p;
            run_hi = p + 1;
        }
    }
    if (run_hi > run_lo)
        report_run(t, s, bits, run_lo, run_hi, fn, user);
    return 0;
}

void mapping__mprot_clear(mapping_track_region *t, uintptr_t lo, uintptr_t hi)
{
    mprot_slot *s = &slots[t->slot];
    _Atomic uint64_t *bits = atomic_load_explicit(&s->bits, memory_order_relaxed);
    if (mprotect((void *)lo, hi - lo, RO(t)) != 0) {
        mprotect((void *)lo, hi - lo, RW(t)); /* stays writable and counted written */
        return;
    }
    for (size_t p = (lo - t->lo) / page_size, e = (hi - t->lo) / page_size; p < e; p++)
        atomic_fetch_and_explicit(&bits[p / 64], ~((uint64_t)1 << (p % 64)), memory_order_acq_rel);
}

void mapping__mprot_release(mapping_track_region *t, uintptr_t lo, uintptr_t hi)
{
    mprot_slot *s = &slots[t->slot];
    _Atomic uint64_t *bits = atomic_load_explicit(&s->bits, memory_order_relaxed);
    if (mprotect((void *)lo, hi - lo, RW(t)) != 0)
        return;
    for (size_t p = (lo - t->lo) / page_size, e = (hi - t->lo) / page_size; p < e; p++)
        atomic_fetch_or_explicit(&bits[p / 64], (uint64_t)1 << (p % 64), memory_order_release);
    atomic_fetch_add_explicit(&s->dirty, 1, memory_order_release);
}
