/* Passing a SIGSEGV on to the handler installed before ours (signal_chain.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "track/signal_chain.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/syscall.h>

/* The kernel tells SIG_DFL and SIG_IGN by the handler's value alone,
 * whatever the flags say (SA_SIGINFO with a null function is SIG_DFL). */
static bool no_handler(const struct sigaction *sa)
{
    return sa->sa_handler == SIG_DFL || sa->sa_handler == SIG_IGN;
}

static bool same_handler(const struct sigaction *a, const struct sigaction *b)
{
    return a->sa_handler == b->sa_handler && (a->sa_flags & SA_SIGINFO) == (b->sa_flags & SA_SIGINFO);
}

static bool is_ours(const struct sigaction *sa, void (*ours)(int, siginfo_t *, void *))
{
    return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == ours;
}

static void default_action(struct sigaction *sa)
{
    memset(sa, 0, sizeof *sa);
    sa->sa_handler = SIG_DFL;
    sigemptyset(&sa->sa_mask);
}

/* Every signal a process can be sent, but not those a fault raises in the
 * thread that faults (blocked, the kernel kills the process on one). */
static void asynchronous_signals(sigset_t *set)
{
    sigfillset(set);
    static const int synchronous[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS, SIGABRT};
    for (size_t i = 0; i < sizeof synchronous / sizeof *synchronous; i++)
        sigdelset(set, synchronous[i]);
}

/* Ours, with the previous handler's SA_ONSTACK and SA_RESTART: the kernel
 * then runs the previous handler (called from ours) on the stack it asked
 * for, and a SIGSEGV sent to a thread blocked in a system call interrupts
 * it or not as the program chose. With no previous handler: on the
 * alternate stack where the thread has one (a tracked write near the end
 * of a thread's stack still has room), restarting. SA_NODEFER: a fault
 * inside our handler, or a handler we call, reaches us (the kernel would
 * kill the process on a fault with SIGSEGV blocked). The mask: every
 * signal another thread or process can send, so that no handler of the
 * program runs on top of ours and leaves it halfway by siglongjmp (the
 * counts it holds, which a sync and a mirror's end wait on, were never
 * given back: they waited forever); such a signal waits until ours
 * returns. The previous handler runs with its own mask, not this one
 * (mapping_track_sigsegv_chain). */
static void fill_ours(struct sigaction *sa, void (*ours)(int, siginfo_t *, void *), const struct sigaction *previous)
{
    memset(sa, 0, sizeof *sa);
    sa->sa_sigaction = ours;
    sa->sa_flags = SA_SIGINFO | SA_NODEFER |
                   (no_handler(previous) ? SA_ONSTACK | SA_RESTART : previous->sa_flags & (SA_ONSTACK | SA_RESTART));
    asynchronous_signals(&sa->sa_mask);
}

/* The library's handlers (every chain's `ours`): when one of them is the
 * installed handler, the kernel ran it with its own mask on top of the
 * interrupted context's. */
enum { LIBRARY_HANDLERS = 8 };
static _Atomic uintptr_t library_handlers[LIBRARY_HANDLERS];

static void register_library_handler(void (*ours)(int, siginfo_t *, void *))
{
    for (int i = 0; i < LIBRARY_HANDLERS; i++) {
        uintptr_t none = 0;
        if (atomic_load(&library_handlers[i]) == (uintptr_t)ours ||
            atomic_compare_exchange_strong(&library_handlers[i], &none, (uintptr_t)ours))
            return;
    }
}

static bool is_library_handler(const struct sigaction *sa)
{
    if (!(sa->sa_flags & SA_SIGINFO))
        return false;
    for (int i = 0; i < LIBRARY_HANDLERS; i++)
        if (atomic_load(&library_handlers[i]) == (uintptr_t)sa->sa_sigaction)
            return true;
    return false;
}

/* ---- the previous handler, read and written by handlers on any thread ---- */

static void load_copy(mapping_track_sigchain *c, unsigned which, struct sigaction *out)
{
    unsigned long w[MAPPING_TRACK_SIGACTION_WORDS];
    for (size_t i = 0; i < MAPPING_TRACK_SIGACTION_WORDS; i++)
        w[i] = atomic_load_explicit(&c->previous[which][i], memory_order_relaxed);
    memcpy(out, w, sizeof *out);
}

static void store_copy(mapping_track_sigchain *c, unsigned which, const struct sigaction *in)
{
    unsigned long w[MAPPING_TRACK_SIGACTION_WORDS] = {0};
    memcpy(w, in, sizeof *in);
    for (size_t i = 0; i < MAPPING_TRACK_SIGACTION_WORDS; i++)
        atomic_store_explicit(&c->previous[which][i], w[i], memory_order_relaxed);
}

/* The previous handler and its version. Never waits: a writer fills the
 * copy that is not current; the copy read is only rewritten by the writer
 * of the version after next, so it was whole if `state` did not get past
 * the next version's publication meanwhile (else read again). */
static unsigned read_previous(mapping_track_sigchain *c, struct sigaction *out)
{
    for (;;) {
        unsigned s = atomic_load_explicit(&c->state, memory_order_acquire);
        load_copy(c, (s >> 1) & 1, out);
        atomic_thread_fence(memory_order_acquire);
        unsigned t = atomic_load_explicit(&c->state, memory_order_relaxed);
        if (t - (s & ~1u) <= 2)
            return s >> 1;
    }
}

/* Makes *sa the previous handler (the next version) if no other writer is
 * at it and, unless `any`, the version is still `expect`. */
static bool write_previous(mapping_track_sigchain *c, unsigned expect, bool any, const struct sigaction *sa)
{
    unsigned s = atomic_load_explicit(&c->state, memory_order_relaxed);
    if ((s & 1) || (!any && s >> 1 != expect))
        return false;
    if (!atomic_compare_exchange_strong_explicit(&c->state, &s, s | 1, memory_order_acquire, memory_order_relaxed))
        return false;
    atomic_thread_fence(memory_order_release); /* a reader that sees the new words sees the busy state */
    unsigned next = (s >> 1) + 1;
    store_copy(c, next & 1, sa);
    atomic_store_explicit(&c->state, next << 1, memory_order_release);
    return true;
}

/* A writer busy on another thread finishes in a few instructions; one
 * interrupted on this very thread (by this signal) cannot: give up after
 * a while rather than wait forever. */
enum { WRITE_TRIES = 1000 };

int mapping_track_sigsegv_install(mapping_track_sigchain *c, void (*ours)(int, siginfo_t *, void *))
{
    /* The handler there now is recorded before ours goes in: sigaction
     * swaps the handlers, then copies the old one out, and a fault on
     * another thread in between would find no previous handler (the
     * default action: the program's own handler would be skipped). */
    struct sigaction before, sa, replaced;
    if (sigaction(SIGSEGV, NULL, &before) != 0)
        return -errno;
    c->ours = ours;
    register_library_handler(ours);
    store_copy(c, 0, &before);
    atomic_store_explicit(&c->state, 0, memory_order_release);
    fill_ours(&sa, ours, &before);
    if (sigaction(SIGSEGV, &sa, &replaced) != 0)
        return -errno;
    if (!same_handler(&replaced, &before) && !is_ours(&replaced, ours)) /* installed by another thread meanwhile */
        for (int tries = 0; tries < WRITE_TRIES && !write_previous(c, 0, true, &replaced); tries++)
            sched_yield();
    /* The handler stays installed for the process's life: the code it
     * points to must too (dlclose of libmapping.so would unmap it). */
    Dl_info self;
    if (dladdr((void *)(uintptr_t)ours, &self) && self.dli_fname)
        (void)dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    return 0;
}

/* The default action, now: the process dies by `sig` as it would have
 * without us. The signal is queued again to this thread with its own
 * siginfo (a fault's address and code stay in the core) while blocked, so
 * it is delivered as soon as the handler returns and the mask comes back,
 * before the faulting instruction runs again. Returning and letting the
 * access fault again is not enough: a signal sent by kill(2) does not come
 * again, nor does a fault whose page another thread made accessible
 * meanwhile; the process went on with the default action installed, and
 * its next tracked write killed it. */
static void die_by_default(int sig, siginfo_t *info)
{
    struct sigaction dfl;
    default_action(&dfl);
    sigaction(sig, &dfl, NULL);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    pthread_sigmask(SIG_BLOCK, &only, NULL);
    pid_t pid = getpid();
    long tid = syscall(SYS_gettid);
    if (!info || syscall(SYS_rt_tgsigqueueinfo, pid, tid, sig, info) != 0)
        (void)syscall(SYS_tgkill, pid, tid, sig); /* else the access faults again under the default action */
}

/* After the previous handler returned: if the installed handler is no
 * longer the one installed when the fault came (top), the previous handler
 * replaced it, taking itself out and putting back the one from before it
 * (LLVM's does): that one becomes our previous handler, and top goes
 * back. Only top, whoever it is: ours, or a handler installed above ours
 * that chained down to it (ours above that one would make them call each
 * other without end). A default or ignored action put there is left: the
 * fault is to be fatal. */
static void put_back(mapping_track_sigchain *c, int sig, const struct sigaction *top)
{
    struct sigaction now;
    if (no_handler(top) || sigaction(sig, NULL, &now) != 0 || same_handler(&now, top) || no_handler(&now) ||
        is_ours(&now, c->ours))
        return;
    struct sigaction again = *top;
    if (is_ours(top, c->ours))
        fill_ours(&again, c->ours, &now);
    /* Top first: a fault on another thread meanwhile finds ours, and at
     * worst calls the previous handler once more. */
    sigaction(sig, &again, NULL);
    for (int tries = 0; tries < WRITE_TRIES && !write_previous(c, 0, true, &now); tries++)
        sched_yield();
}

void mapping_track_sigsegv_chain(mapping_track_sigchain *c, int sig, siginfo_t *info, void *ctx)
{
    int saved_errno = errno;
    struct sigaction top, call;
    bool have_top = sigaction(sig, NULL, &top) == 0;
    for (int tries = 0;; tries++) {
        unsigned version = read_previous(c, &call);
        if (!(call.sa_flags & SA_RESETHAND) || no_handler(&call))
            break;
        /* One-shot: the kernel resets it to the default action as it
         * delivers it, so one fault gets it, on whichever thread; here the
         * caller that moves the version on does. */
        struct sigaction dfl;
        default_action(&dfl);
        if (write_previous(c, version, false, &dfl) || tries >= WRITE_TRIES)
            break;
        sched_yield();
    }
    if (no_handler(&call)) {
        /* Ignored: a SIGSEGV sent by a process (kill, tgkill, sigqueue:
         * si_code <= 0) is discarded; one raised by a fault is fatal all
         * the same (the kernel forces the default action). */
        if (!(call.sa_handler == SIG_IGN && info && info->si_code <= 0))
            die_by_default(sig, info);
        errno = saved_errno;
        return;
    }
    /* As the kernel delivers it: on top of the mask of the context the
     * fault interrupted, its sa_mask, and the signal itself unless
     * SA_NODEFER, blocked while it runs (a handler that faults in turn is
     * then killed, not re-entered); the mask back after it returns (a
     * siglongjmp out of it restores the mask its sigsetjmp saved). The
     * interrupted context's mask is in ctx when the kernel ran a library
     * handler (this one, or another of the library's chaining down to
     * it), whose own mask must not stay; else a handler installed above
     * ours called it, and the mask now is that handler's. */
    sigset_t run, saved;
    const ucontext_t *uc = ctx;
    if (uc && have_top && is_library_handler(&top)) {
        sigemptyset(&run);
        for (int s = 1; s < NSIG; s++)
            if (sigismember(&uc->uc_sigmask, s) == 1)
                sigaddset(&run, s);
    } else if (pthread_sigmask(SIG_SETMASK, NULL, &run) != 0)
        sigemptyset(&run);
    sigorset(&run, &run, &call.sa_mask);
    if (!(call.sa_flags & SA_NODEFER))
        sigaddset(&run, sig);
    bool masked = pthread_sigmask(SIG_SETMASK, &run, &saved) == 0;
    errno = saved_errno;
    if (call.sa_flags & SA_SIGINFO)
        call.sa_sigaction(sig, info, ctx);
    else
        call.sa_handler(sig);
    int handler_errno = errno; /* what the handler left, as without us */
    if (masked)
        pthread_sigmask(SIG_SETMASK, &saved, NULL);
    if (have_top)
        put_back(c, sig, &top);
    errno = handler_errno;
}

/* ---- late faults ---- */

/* A page passed again and again in a short time is protected again each
 * time by something else: after that many passes, the fault goes on. */
enum { PASSES_MAX = 1000 };
static const int64_t PASS_WINDOW_NS = 100 * 1000 * 1000;
static _Atomic uintptr_t pass_page;
static _Atomic unsigned  pass_count;
static _Atomic int64_t   pass_since_ns;

static bool passes_left(uintptr_t page)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return false;
    int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    if (atomic_exchange(&pass_page, page) != page || now - atomic_load(&pass_since_ns) > PASS_WINDOW_NS) {
        atomic_store(&pass_since_ns, now);
        atomic_store(&pass_count, 1);
        return true;
    }
    return atomic_fetch_add(&pass_count, 1) < PASSES_MAX;
}

bool mapping_track_fault_passes_now(const siginfo_t *info, void *ctx, size_t page)
{
#if defined(__x86_64__) && defined(REG_ERR) && defined(MADV_POPULATE_WRITE) && defined(MADV_POPULATE_READ)
    enum { PF_WRITE = 1 << 1, PF_INSTR = 1 << 4 }; /* x86 page-fault error code bits */
    if (!info || !ctx || info->si_code != SEGV_ACCERR || !page)
        return false;
    const ucontext_t *uc = ctx;
    long long err = (long long)uc->uc_mcontext.gregs[REG_ERR];
    if (err & PF_INSTR)
        return false;
    uintptr_t p = (uintptr_t)info->si_addr & ~(uintptr_t)(page - 1);
    if (!passes_left(p))
        return false;
    int saved = errno;
    /* Faults the page in as the access would (no change to its content);
     * fails where the mapping does not allow that access (EINVAL, EFAULT),
     * and on kernels without the advice (EINVAL). */
    bool ok = madvise((void *)p, page, (err & PF_WRITE) ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0;
    errno = saved;
    return ok;
#else
    (void)info;
    (void)ctx;
    (void)page;
    return false;
#endif
}

enum { HISTORY_BITS = 64 * 64, CHUNK_SHIFT = 21 };

static size_t history_bit(uintptr_t chunk)
{
    return (size_t)(((uint64_t)chunk * 0x9E3779B97F4A7C15ull) >> 52); /* 12 bits: 0 .. 4095 */
}

void mapping_track_fault_history_add(mapping_track_fault_history *h, uintptr_t lo, uintptr_t hi)
{
    if (hi <= lo)
        return;
    uintptr_t a = lo >> CHUNK_SHIFT, b = (hi - 1) >> CHUNK_SHIFT;
    if (b - a >= HISTORY_BITS) {
        for (size_t w = 0; w < HISTORY_BITS / 64; w++)
            atomic_store(&h->bits[w], ~(uint64_t)0);
        return;
    }
    for (uintptr_t chunk = a;; chunk++) {
        size_t bit = history_bit(chunk);
        atomic_fetch_or(&h->bits[bit / 64], (uint64_t)1 << (bit % 64));
        if (chunk == b)
            break;
    }
}

bool mapping_track_fault_history_has(const mapping_track_fault_history *h, uintptr_t addr)
{
    size_t bit = history_bit(addr >> CHUNK_SHIFT);
    return (atomic_load(&h->bits[bit / 64]) >> (bit % 64)) & 1;
}
