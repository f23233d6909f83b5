/*
 * The mirror core against a byte model, over the whole feature matrix
 * (issue 36): write tracking {none, uffd, mprotect} x device diff {off, on}
 * (both per process: MAPPING_TRACK, MAPPING_DEVICE_DIFF; tests/CMakeLists.txt
 * registers one CTest test per pair and back end) x race checker {off, on}
 * (mapping_device_set_checks) x shape {whole mirror, views, sharded,
 * multimirror} x sync {blocking, streams}: the 16 cells of one process run
 * seeded op sequences in turn.
 *
 * The model (the contract of docs/mirrors.md as the lead decided it):
 * - per byte and side (CPU, each device side): valid or stale, never stale
 *   on every side; "modified" per side (a mark not yet seen by the others);
 * - the exact content of every side's memory: the CPU array as the program
 *   and the library wrote it, each device buffer as the program (raw fills
 *   and copies) and the library's syncs wrote it;
 * - mark X over r: CONFLICT (nothing changes, stats.conflicts + 1) when X is
 *   stale somewhere in r where another side holds a modification; else X
 *   valid and modified on r, the others stale and unmodified;
 * - a tracked CPU write is mark_cpu_modified of exactly the bytes whose
 *   content changed since the last call on the family (or since the library
 *   wrote them), made at the start of the next call on the family (any
 *   call). Where such a byte is stale on the CPU under another side's
 *   modification, the conflict is counted, the call does not fail, and the
 *   device's content wins;
 * - sync to X copies the bytes stale on X (merging may add gaps under 64
 *   bytes valid on both sides: the planning link is set so that only the
 *   batch's gaps merge); on a stream its bytes count as valid at once for
 *   every later call (queued copies count as synced, stale_bytes waits for
 *   them, needs_sync counts them as done), and its memory is in flight until
 *   mapping_stream_synchronize of that stream;
 * - acquire READ syncs, WRITE marks, WRITE alone discards (no conflict, the
 *   other side's modifications in the view are dropped); release_gpu only
 *   orders;
 * - the device diff and the race checker change nothing a race-free program
 *   can see, only bytes moved.
 *
 * After every step both sides' memory is compared with the model byte for
 * byte (the device read back with a raw mapping_sync_to_cpu_range that does
 * not touch the mirror; memory in flight is skipped: CPU pages within 64
 * bytes of a queued copy, device bytes likewise), and at the end of each
 * sequence everything is synced both ways and must equal the model, with no
 * stale byte left. Every call's status is checked against the model, the
 * stale counts and needs_sync answers of the random queries too, and after
 * each call the device's stats.conflicts must have grown by what the model
 * says. The payload counters of a blocking sync on an idle device may not
 * exceed the stale bytes (with the diff: of the 4 KiB blocks holding them)
 * and must be 0, like the driver counters, when nothing is stale.
 *
 * Sequences are race-free by construction: the CPU never touches a page a
 * queued copy may read or write (it synchronizes the stream first), raw
 * device writes avoid device bytes in flight, writes from host functions go
 * on a stream that is synchronized before the next call, writes from other
 * threads are joined first.
 *
 * Steps: MAPPING_MODEL_STEPS per process (default 8000, a tenth under the
 * sanitizers), spread over the 16 cells. A failure prints the seed, the step,
 * the op trace of the sequence and the command that replays it:
 * MAPPING_TEST_SEED=<n> runs that one sequence (cell n % 16); <first>-<last> runs
 * a range in order (a failure may need the library state earlier sequences
 * left), MAPPING_MODEL_SEQ_STEPS=<k> stops the last one after k steps.
 * Diagnosis only, never in CI: MAPPING_MODEL_PAGE_GRANULAR=1 accepts stale
 * counts and moved bytes rounded up to tracked pages; MAPPING_MODEL_LEGACY=1
 * runs the contract before issue 36 (that, plus a blocking sync of a tracked
 * family to the device before every GPU mark, tracked writes only where the
 * CPU side is valid, tracked conflicts not counted, tracked families the
 * library allocates a page multiple), so a run can look past
 * the known differences for other lost writes. MAPPING_MODEL_TRACE=1 prints
 * each op as it runs; MAPPING_MODEL_KEEP_GOING=1 goes on after a failed
 * sequence and ends with the failures counted by kind; MAPPING_MODEL_REDUCE=1
 * with MAPPING_TEST_SEED=<n> finds the fewest steps of sequence n that still
 * fail the same way (each step draws from its own generator, so a step left
 * out changes no other step's choices), and MAPPING_MODEL_STEPS_ONLY=<list>
 * runs only those steps of it.
 *
 * Memory budgets (issue 40): half the sequences run under random device
 * memory budgets, from one family's size up to less than the working set
 * (the shapes of one device side get a second family on the same device,
 * so that a call on one evicts the other), with ops that evict a family
 * now, hint, allocate and free plain buffers, and set a new budget (none,
 * one smaller than a family, or another random one). The model learns of
 * every eviction by asking mapping_mirror_is_resident after each call:
 * an eviction is the family's collect and a sync to the CPU of all of it,
 * after which its device side is stale and unknown everywhere; the bytes
 * the device's statistics say were written back must equal the bytes the
 * model had stale on the CPU. A sync or acquire that must make a device
 * side again may fail with MAPPING_ERR_OUT_OF_DEVICE_MEMORY when the
 * budget leaves no room (the others being kept, in flight, or the budget
 * below the family's size): the model then checks that nothing changed; a
 * GPU mark of a family that is not resident must be refused. Device bytes
 * a mark makes valid that the model does not know (a buffer made again)
 * are read back raw and learnt.
 *
 * The same engine runs from fuzz input (tests/fuzz/fuzz_model.c): compiled
 * there with MIRROR_MATRIX_FUZZ, it reads its choices from the input bytes
 * and aborts on a mismatch.
 */
#include <ctype.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include "harness.h"

enum {
    PAGE = 4096,
    GAP = 64,          /* merges: gaps below this many bytes (batches; the link is set to merge less) */
    MAXDEV = 2,        /* device sides of a family; devices of the world */
    NSIDE = 1 + MAXDEV,
    MAXH = 4,          /* handles of a family: the root and 3 views */
    MAXFAM = 2,
    NSTREAM = 2,       /* per device */
    MAXFLIGHT = 48,    /* per stream */
    TRACE_LINES = 512, /* per sequence */
    TRACE_COLS = 160,
    SEQ_STEPS = 200,
    NCELLS = 16
};

enum { SHAPE_WHOLE, SHAPE_VIEWS, SHAPE_SHARDED, SHAPE_MULTI };
static const char *const shape_names[] = {"whole", "views", "sharded", "multimirror"};

/* ---- the world ---- */

typedef struct flight {
    int    fam;
    int    sides; /* bit 0: the CPU, bit 1 + j: device side j */
    size_t lo, hi;
} flight;

typedef struct mstream {
    mapping_stream *s;
    int             dev;
    flight          f[MAXFLIGHT];
    int             nf;
} mstream;

typedef struct fam {
    int             multi;
    size_t          n;
    unsigned char  *cpu;     /* the real CPU side */
    void           *wrapped; /* the caller's memory (wrap, sharded) */
    int             ndev;
    int             dev[MAXDEV]; /* device of each side (index into the world's devices) */
    mapping_buffer *gbuf[MAXDEV];
    size_t          goff[MAXDEV];
    mapping_mirror *h[MAXH];
    size_t          hoff[MAXH], hlen[MAXH];
    int             nh;
    mapping_multimirror *mm;
    int             tracked, diff;
    int             res[MAXDEV]; /* budget sequences: device side j is resident (as last observed) */
    /* the model: side 0 the CPU, 1 + j device side j */
    unsigned char  *mem[NSIDE], *known[NSIDE], *valid[NSIDE], *mod[NSIDE];
    unsigned char  *base; /* the CPU content the last call saw (tracked) */
    int             all_known[NSIDE];
} fam;

typedef struct cell {
    int shape, streams, race;
} cell;

typedef struct world {
    mapping_device *dev[MAXDEV];
    int             own_dev[MAXDEV];
    int             ndev;
    mstream         st[MAXDEV * NSTREAM];
    int             mechanism; /* mapping_track_mechanism */
    int             diff_env;  /* MAPPING_DEVICE_DIFF: 0 off, 1 on, 2 auto/unset */
    int             page_granular;
    int             legacy; /* diagnosis: the contract before issue 36 (see the top) */
    /* the sequence */
    cell            c;
    int             tracked; /* the sequence's families track writes */
    fam             f[MAXFAM];
    int             nf;
    unsigned        seed;
    int             step;
    unsigned long long rng;
    const uint8_t  *in; /* fuzz input, or NULL */
    const unsigned char *keep; /* steps to run (a reduction), or NULL: all */
    size_t          in_size, in_pos;
    char            trace[TRACE_LINES][TRACE_COLS];
    int             ntrace;
    int             verbose;
    unsigned char  *scratch, *src, *mask, *restore;
    size_t          scratch_n;
    unsigned long long steps_total, bytes_checked, conflicts_seen, tracked_conflicts_seen, stale_queries;
    unsigned long long stats_checks, syncs, stream_ops;
    /* memory budgets (issue 40) */
    int             budget_on;
    uint64_t        budget[MAXDEV];
    mapping_buffer *press[MAXDEV]; /* a plain buffer held on the device */
    uint64_t        wb_seen[MAXDEV]; /* stats.evict_writeback_bytes at the last look */
    unsigned char  *save;           /* a family's model, saved before a call that may fail */
    size_t          save_n;
    unsigned long long evictions_seen, materialized_seen, oom_seen, budget_seqs;
} world;

/* ---- reporting ---- */

static void trace(world *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(world *w, const char *fmt, ...)
{
    char *line = w->trace[w->ntrace++ % TRACE_LINES];
    int n = snprintf(line, TRACE_COLS, "step %3d: ", w->step);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, (size_t)(TRACE_COLS - n), fmt, ap);
    va_end(ap);
    if (w->verbose)
        fprintf(stderr, "%s\n", line);
}

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

#ifndef MIRROR_MATRIX_FUZZ
/* MAPPING_MODEL_KEEP_GOING=1 (diagnosis): a failure ends its sequence only;
 * the failures are counted by kind (the message without its numbers). */
typedef struct failure_kind {
    char     key[120];
    unsigned count, seed;
    int      step;
} failure_kind;
static failure_kind kinds[64];
static int          nkinds;
static jmp_buf     *keep_going;
static char         last_failure[400];
static int          last_failure_step, counting = 1;

static void count_failure(world *w, const char *msg)
{
    char key[120];
    size_t k = 0;
    for (const char *p = msg; *p && k + 1 < sizeof key; p++) {
        if (isdigit((unsigned char)*p) || (*p == 'x' && p > msg && p[-1] == '0')) {
            if (k == 0 || key[k - 1] != '#')
                key[k++] = '#';
            continue;
        }
        if (k && key[k - 1] == '#' && isxdigit((unsigned char)*p) && !isalpha((unsigned char)p[1]))
            continue;
        key[k++] = *p;
    }
    key[k] = 0;
    for (int i = 0; i < nkinds; i++)
        if (strcmp(kinds[i].key, key) == 0) {
            kinds[i].count++;
            if (w->step < kinds[i].step) { /* keep the earliest */
                kinds[i].step = w->step;
                kinds[i].seed = w->seed;
            }
            return;
        }
    if (nkinds < 64) {
        snprintf(kinds[nkinds].key, sizeof kinds[nkinds].key, "%s", key);
        kinds[nkinds].count = 1;
        kinds[nkinds].seed = w->seed;
        kinds[nkinds++].step = w->step;
    }
}
#endif

static void fail(world *w, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fail(world *w, const char *fmt, ...)
{
#ifndef MIRROR_MATRIX_FUZZ
    if (keep_going) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        memcpy(last_failure, msg, sizeof msg);
        last_failure_step = w->step;
        if (counting)
            count_failure(w, msg);
        longjmp(*keep_going, 1);
    }
#endif
    int first = w->ntrace > TRACE_LINES ? w->ntrace - TRACE_LINES : 0;
    fprintf(stderr, "mirror model: the ops of this sequence (%d):\n", w->ntrace);
    for (int i = first; i < w->ntrace; i++)
        fprintf(stderr, "  %s\n", w->trace[i % TRACE_LINES]);
    char which[64];
    if (w->in)
        snprintf(which, sizeof which, "the fuzz input (%zu bytes)", w->in_size);
    else
        snprintf(which, sizeof which, "seed %u", w->seed);
    fprintf(stderr, "mirror model: FAILED at step %d of %s (cell: %s, %s, race checker %s; tracking %s, device "
                    "diff env %s, families: ",
            w->step, which, shape_names[w->c.shape], w->c.streams ? "streams" : "blocking", w->c.race ? "on" : "off",
            mapping_write_tracking_description(), env_or("MAPPING_DEVICE_DIFF", "auto"));
    for (int i = 0; i < w->nf; i++)
        fprintf(stderr, "%s%zu bytes%s%s", i ? ", " : "", w->f[i].n, w->f[i].tracked ? " tracked" : "",
                w->f[i].diff ? " diff" : "");
    fprintf(stderr, "):\n  ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  (last error: %s)\n", mapping_last_error_message());
#ifdef MIRROR_MATRIX_FUZZ
    fflush(stderr);
    abort();
#else
    fprintf(stderr, "replay: MAPPING_BACKEND=%s MAPPING_TRACK=%s MAPPING_DEVICE_DIFF=%s MAPPING_TEST_SEED=%u "
                    "mapping_tests mirror_matrix_model\n",
            test_backend(), env_or("MAPPING_TRACK", "auto"), env_or("MAPPING_DEVICE_DIFF", "auto"), w->seed);
    test_fail(__FILE__, __LINE__, "mirror model: seed %u, step %d", w->seed, w->step);
#endif
}

#define EXPECT(w, expr, expected)                                                                                  \
    do {                                                                                                           \
        mapping_status s_ = (expr), e_ = (expected);                                                               \
        if (s_ != e_)                                                                                              \
            fail(w, "%s returned %s, expected %s (%s)", #expr, mapping_status_name(s_), mapping_status_name(e_),    \
                 s_ ? mapping_last_error_message() : "");                                                          \
    } while (0)

/* ---- choices: a seeded generator, or the fuzz input ---- */

static unsigned long long rnd(world *w)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

static size_t pick(world *w, size_t n)
{
    if (n <= 1)
        return 0;
    if (w->in) {
        size_t v = w->in_pos < w->in_size ? w->in[w->in_pos++] : 0;
        if (n > 256)
            v |= (size_t)(w->in_pos < w->in_size ? w->in[w->in_pos++] : 0) << 8;
        if (n > 65536)
            v |= (size_t)(rnd(w) & 0xffff) << 16;
        return v % n;
    }
    return (size_t)(rnd(w) % n);
}

static unsigned char byte_value(world *w)
{
    return (unsigned char)(rnd(w) >> 24);
}

/* ---- streams and memory in flight ---- */

static mstream *stream_of(world *w, int dev, int k)
{
    return &w->st[dev * NSTREAM + k];
}

/* A stream of device `dev`, or NULL (blocking). Blocking cells always NULL. */
static mstream *choose_stream(world *w, int dev)
{
    if (!w->c.streams || pick(w, 10) < 3)
        return NULL;
    return stream_of(w, dev, (int)pick(w, NSTREAM));
}

static void stream_sync(world *w, mstream *ms, const char *why)
{
    trace(w, "stream_synchronize(stream %d.%d)%s", ms->dev, (int)(ms - stream_of(w, ms->dev, 0)), why);
    EXPECT(w, mapping_stream_synchronize(ms->s), MAPPING_OK);
    ms->nf = 0;
}

static void sync_all_streams(world *w, const char *why)
{
    for (int i = 0; i < w->ndev * NSTREAM; i++)
        if (w->st[i].nf)
            stream_sync(w, &w->st[i], why);
}

static void add_flight(world *w, mstream *ms, int fi, int sides, size_t lo, size_t hi)
{
    if (ms->nf == MAXFLIGHT) /* full: what is queued ends first */
        stream_sync(w, ms, " (flight list full)");
    size_t n = w->f[fi].n;
    lo = lo > GAP ? lo - GAP : 0;
    hi = hi + GAP < n ? hi + GAP : n;
    ms->f[ms->nf++] = (flight){fi, sides, lo, hi};
}

static uintptr_t page_down(uintptr_t a)
{
    return a & ~(uintptr_t)(PAGE - 1);
}

/* Whether CPU bytes [lo, hi) of family fi share a page with memory in flight
 * (on any stream but `except`). */
static bool cpu_in_flight(world *w, int fi, size_t lo, size_t hi, const mstream *except)
{
    uintptr_t a0 = page_down((uintptr_t)(w->f[fi].cpu + lo)), a1 = page_down((uintptr_t)(w->f[fi].cpu + hi - 1)) + PAGE;
    for (int i = 0; i < w->ndev * NSTREAM; i++) {
        const mstream *ms = &w->st[i];
        if (ms == except)
            continue;
        for (int k = 0; k < ms->nf; k++) {
            const flight *fl = &ms->f[k];
            if (!(fl->sides & 1))
                continue;
            const fam *g = &w->f[fl->fam];
            uintptr_t b0 = page_down((uintptr_t)(g->cpu + fl->lo)), b1 = page_down((uintptr_t)(g->cpu + fl->hi - 1)) + PAGE;
            if (a0 < b1 && b0 < a1)
                return true;
        }
    }
    return false;
}

/* Whether device side j's bytes [lo, hi) of family fi are in flight. */
static bool dev_in_flight(world *w, int fi, int j, size_t lo, size_t hi)
{
    for (int i = 0; i < w->ndev * NSTREAM; i++) {
        const mstream *ms = &w->st[i];
        for (int k = 0; k < ms->nf; k++) {
            const flight *fl = &ms->f[k];
            if (fl->fam == fi && (fl->sides & (2 << j)) && lo < fl->hi && fl->lo < hi)
                return true;
        }
    }
    return false;
}

static bool device_idle(world *w, int dev)
{
    for (int k = 0; k < NSTREAM; k++)
        if (stream_of(w, dev, k)->nf)
            return false;
    return true;
}

/* ---- the model ---- */

static int nsides(const fam *f)
{
    return 1 + f->ndev;
}

static bool other_mod(const fam *f, int side, size_t b)
{
    for (int s = 0; s < nsides(f); s++)
        if (s != side && f->mod[s][b])
            return true;
    return false;
}

static bool model_conflict(const fam *f, int side, size_t lo, size_t hi)
{
    for (size_t b = lo; b < hi; b++)
        if (!f->valid[side][b] && other_mod(f, side, b))
            return true;
    return false;
}

static void model_mark(fam *f, int side, size_t lo, size_t hi)
{
    for (int s = 0; s < nsides(f); s++) {
        memset(f->valid[s] + lo, s == side, hi - lo);
        memset(f->mod[s] + lo, s == side, hi - lo);
    }
}

static int truth_side(const fam *f, size_t b)
{
    for (int s = 0; s < nsides(f); s++)
        if (f->valid[s][b])
            return s;
    return -1;
}

/* A tracked family's collect, at the start of every call: the CPU bytes
 * whose content changed become CPU marks. Returns 1 when one of them is
 * stale on the CPU under another side's modification (a conflict counted,
 * the device's content wins). */
static int model_collect(world *w, fam *f)
{
    (void)w;
    if (memcmp(f->mem[0], f->base, f->n) == 0)
        return 0;
    if (!f->tracked)
        fail(w, "model: an untracked family's CPU side changed without a mark (the generator's bug)");
    int conflict = 0;
    for (size_t b = 0; b < f->n; b++) {
        if (f->mem[0][b] == f->base[b])
            continue;
        if (!f->valid[0][b] && other_mod(f, 0, b))
            conflict = 1;
        else
            model_mark(f, 0, b, b + 1);
        f->base[b] = f->mem[0][b];
    }
    return conflict;
}

/* Sync of [lo, hi) to side t: every stale byte there takes the content of a
 * valid side. Returns the bytes made valid; *span_lo/hi their extent; *bound
 * the bytes a sync may move (stale + merged gaps); *blocks the bytes of the
 * 4 KiB blocks holding them. */
typedef struct sync_plan {
    size_t stale, lo, hi, bound, blocks, runs;
} sync_plan;

static sync_plan model_sync(fam *f, int t, size_t lo, size_t hi)
{
    sync_plan p = {0, (size_t)-1, 0, 0, 0, 0};
    size_t last_end = (size_t)-1, last_block = (size_t)-1;
    for (size_t b = lo; b < hi; b++) {
        if (f->valid[t][b]) { /* skip to the next stale byte */
            const unsigned char *z = memchr(f->valid[t] + b, 0, hi - b);
            if (!z)
                break;
            b = (size_t)(z - f->valid[t]);
        }
        int s = truth_side(f, b);
        f->mem[t][b] = f->mem[s][b];
        f->valid[t][b] = 1;
        if (f->known[t])
            f->known[t][b] = 1;
        if (t == 0)
            f->base[b] = f->mem[0][b];
        if (last_end != b) {
            p.runs++;
            if (last_end != (size_t)-1 && b - last_end < GAP)
                p.bound += b - last_end;
        }
        last_end = b + 1;
        if (b / PAGE != last_block) {
            last_block = b / PAGE;
            size_t blo = last_block * PAGE, bhi = blo + PAGE < f->n ? blo + PAGE : f->n;
            p.blocks += bhi - blo;
        }
        p.stale++;
        p.lo = p.lo < b ? p.lo : b;
        p.hi = b + 1;
    }
    p.bound += p.stale;
    return p;
}

static size_t model_stale(const fam *f, int side, size_t lo, size_t hi)
{
    size_t n = 0;
    for (size_t b = lo; b < hi; b++)
        n += !f->valid[side][b];
    return n;
}

/* The model's own rules hold: a byte valid somewhere; sides valid at a
 * byte (and not written since the last collect) agree. */
static void model_self_check(world *w)
{
    for (int i = 0; i < w->nf; i++) {
        fam *f = &w->f[i];
        for (size_t b = 0; b < f->n; b++) {
            int s0 = truth_side(f, b);
            if (s0 < 0)
                fail(w, "model: family %d byte %zu is stale on every side", i, b);
            for (int s = s0 + 1; s < nsides(f); s++)
                if (f->valid[s][b] && f->mem[s][b] != f->mem[s0][b] && (s0 != 0 || f->mem[0][b] == f->base[b]))
                    fail(w, "model: family %d byte %zu valid on sides %d and %d with 0x%02x and 0x%02x", i, b, s0, s,
                         f->mem[s0][b], f->mem[s][b]);
        }
    }
}

/* ---- checks against the library ---- */

static void refresh_known(fam *f, int s)
{
    if (!f->all_known[s])
        f->all_known[s] = memchr(f->known[s], 0, f->n) == NULL;
}

static uint64_t conflicts_now(world *w)
{
    uint64_t n = 0;
    for (int d = 0; d < w->ndev; d++) {
        mapping_stats s;
        EXPECT(w, mapping_device_stats(w->dev[d], &s), MAPPING_OK);
        n += s.conflicts;
    }
    return n;
}

/* ---- memory budgets (issue 40) ---- */

/* An eviction of device side j, as the model sees it: the family's
 * collect (returned: 1 when it found a tracked conflict), then the bytes
 * only j holds (stale on the CPU, valid on j) copied to the CPU (*back of
 * them); j stale and unknown everywhere. A mirror's CPU modifications the
 * device had seen are no longer any (its new staleness is initial), and its
 * device's were written back; a multimirror keeps every side's (the
 * library keeps j's as the CPU's: the same conflicts). */
static int model_evict(world *w, fam *f, int j, size_t *back)
{
    int s = 1 + j, tc = model_collect(w, f);
    *back = 0;
    for (size_t b = 0; b < f->n; b++) {
        if (!f->valid[0][b] && f->valid[s][b]) {
            f->mem[0][b] = f->base[b] = f->mem[s][b];
            f->valid[0][b] = 1;
            ++*back;
        }
        if (!f->multi)
            f->mod[0][b] &= (unsigned char)!f->valid[s][b];
    }
    memset(f->valid[s], 0, f->n);
    if (!f->multi)
        memset(f->mod[s], 0, f->n);
    memset(f->known[s], 0, f->n);
    f->all_known[s] = 0;
    f->gbuf[j] = NULL;
    return tc;
}

static int resident_now(const fam *f, int j)
{
    return f->multi ? mapping_multimirror_is_resident(f->mm, j) : mapping_mirror_is_resident(f->h[0]);
}

/* After a call: the families whose device side went (evicted: the model
 * follows) or came back (made again: its new buffer). The bytes each
 * device says its evictions wrote back must be the model's. Returns how
 * many evictions' collects found a tracked conflict. */
static int observe_residency(world *w)
{
    if (!w->budget_on)
        return 0;
    int tcs = 0;
    uint64_t back[MAXDEV] = {0};
    for (int i = 0; i < w->nf; i++) {
        fam *f = &w->f[i];
        for (int j = 0; j < f->ndev; j++) {
            int r = resident_now(f, j);
            if (f->res[j] && !r) {
                size_t b = 0;
                tcs += model_evict(w, f, j, &b);
                back[f->dev[j]] += b;
                w->evictions_seen++;
                trace(w, "family %d: device side %d evicted, %zu bytes written back", i, j, b);
            } else if (!f->res[j] && r) {
                f->gbuf[j] = f->multi ? mapping_multimirror_gpu(f->mm, j) : mapping_mirror_gpu(f->h[0]);
                w->materialized_seen++;
                trace(w, "family %d: device side %d resident again", i, j);
            }
            f->res[j] = r;
        }
    }
    for (int d = 0; d < w->ndev; d++) {
        mapping_stats st;
        EXPECT(w, mapping_device_stats(w->dev[d], &st), MAPPING_OK);
        uint64_t got = st.evict_writeback_bytes - w->wb_seen[d];
        w->wb_seen[d] = st.evict_writeback_bytes;
        if (got != back[d])
            fail(w, "device %d: evictions wrote back %llu bytes; the evicted families had %llu bytes stale on the CPU",
                 d, (unsigned long long)got, (unsigned long long)back[d]);
    }
    return tcs;
}

/* A family's model, saved before a call that may fail for want of room in
 * the budget (nothing may change then), and put back. */
static void model_save(world *w, const fam *f)
{
    size_t n = f->n, need = (size_t)(4 * nsides(f) + 1) * n;
    if (need > w->save_n) {
        free(w->save);
        w->save = malloc(need);
        w->save_n = w->save ? need : 0;
        if (!w->save)
            fail(w, "out of memory");
    }
    unsigned char *p = w->save;
    for (int s = 0; s < nsides(f); s++) {
        memcpy(p, f->mem[s], n), p += n;
        memcpy(p, f->known[s], n), p += n;
        memcpy(p, f->valid[s], n), p += n;
        memcpy(p, f->mod[s], n), p += n;
    }
    memcpy(p, f->base, n);
}

static void model_restore(world *w, fam *f)
{
    size_t n = f->n;
    const unsigned char *p = w->save;
    for (int s = 0; s < nsides(f); s++) {
        memcpy(f->mem[s], p, n), p += n;
        memcpy(f->known[s], p, n), p += n;
        memcpy(f->valid[s], p, n), p += n;
        memcpy(f->mod[s], p, n), p += n;
        f->all_known[s] = memchr(f->known[s], 0, n) == NULL;
    }
    memcpy(f->base, p, n);
}

/* A call that had to make the family's device side again failed: only for
 * want of room in a budget, saying so, with nothing changed (the model is
 * put back; the memory checks follow). */
static void check_no_room(world *w, fam *f, int j, mapping_status st, const char *what)
{
    if (st != MAPPING_ERR_OUT_OF_DEVICE_MEMORY || !w->budget[f->dev[j]] ||
        !strstr(mapping_last_error_message(), "memory budget"))
        fail(w, "%s returned %s (%s); only a budget with no room may refuse it", what, mapping_status_name(st),
             mapping_last_error_message());
    if (resident_now(f, j))
        fail(w, "%s failed for want of room, yet the device side is resident", what);
    model_restore(w, f);
    w->oom_seen++;
    trace(w, "  no room in the budget (%llu bytes): refused, nothing changed",
          (unsigned long long)w->budget[f->dev[j]]);
}

/* Device bytes of [lo, hi) a mark made valid that the model does not know
 * (a buffer made again holds anything): the program's device holds them,
 * so they are read back raw and learnt (never in flight: unknown bytes are
 * no queued copy's). */
static void learn_device(world *w, fam *f, int j, size_t lo, size_t hi)
{
    int s = 1 + j;
    if (f->all_known[s])
        return;
    for (size_t b = lo; b < hi;) {
        if (f->known[s][b]) {
            b++;
            continue;
        }
        size_t e = b;
        while (e < hi && !f->known[s][e])
            e++;
        EXPECT(w, mapping_sync_to_cpu_range(NULL, f->gbuf[j], f->goff[j] + b, w->scratch, e - b), MAPPING_OK);
        memcpy(f->mem[s] + b, w->scratch, e - b);
        memset(f->known[s] + b, 1, e - b);
        b = e;
    }
    refresh_known(f, s);
}

/* After a call: conflicts grew by `explicit_` (refused marks) plus at least
 * one where the collect found a tracked conflict (the call's own, or that
 * of an eviction the call made), else by nothing. */
static void check_conflicts(world *w, uint64_t before, int explicit_, int tracked)
{
    int evicted = observe_residency(w);
    uint64_t d = conflicts_now(w) - before;
    w->conflicts_seen += (unsigned)explicit_;
    w->tracked_conflicts_seen += (unsigned)tracked;
    if (w->legacy && tracked && d >= (uint64_t)explicit_)
        return;
    uint64_t least = (uint64_t)explicit_ + (tracked != 0) + (uint64_t)evicted;
    if (tracked || evicted ? d < least : d != (uint64_t)explicit_)
        fail(w, "stats.conflicts grew by %llu; the model says %d refused mark(s)%s%s", (unsigned long long)d, explicit_,
             tracked ? " plus a tracked write over another side's modification (at least 1)" : "",
             evicted ? " plus tracked conflicts found by evictions" : "");
}

/* Every side's memory equals the model, where not in flight. */
static void check_memory(world *w)
{
    for (int i = 0; i < w->nf; i++) {
        fam *f = &w->f[i];
        /* What is in flight: CPU pages, device bytes. */
        unsigned char *skip = w->mask; /* reused: no write is being prepared now */
        bool any[NSIDE] = {false};
        for (int k = 0; k < w->ndev * NSTREAM; k++)
            for (int q = 0; q < w->st[k].nf; q++) {
                const flight *fl = &w->st[k].f[q];
                if (fl->fam != i)
                    continue;
                for (int s = 0; s < nsides(f); s++)
                    if (fl->sides & (1 << s)) {
                        if (!any[s])
                            memset(skip + (size_t)s * f->n, 0, f->n);
                        any[s] = true;
                        size_t lo = fl->lo, hi = fl->hi;
                        if (s == 0) { /* whole pages */
                            uintptr_t a = page_down((uintptr_t)(f->cpu + lo)), b = page_down((uintptr_t)(f->cpu + hi - 1)) + PAGE;
                            lo = a < (uintptr_t)f->cpu ? 0 : (size_t)(a - (uintptr_t)f->cpu);
                            hi = b - (uintptr_t)f->cpu < f->n ? (size_t)(b - (uintptr_t)f->cpu) : f->n;
                        }
                        memset(skip + (size_t)s * f->n + lo, 1, hi - lo);
                    }
            }
        /* Another family's flights on a shared page (sharded, untracked). */
        if (w->nf > 1 && cpu_in_flight(w, i, 0, f->n, NULL)) {
            if (!any[0])
                memset(skip, 0, f->n);
            any[0] = true;
            for (uintptr_t pg = page_down((uintptr_t)f->cpu); pg < (uintptr_t)(f->cpu + f->n); pg += PAGE) {
                size_t lo = pg < (uintptr_t)f->cpu ? 0 : (size_t)(pg - (uintptr_t)f->cpu);
                size_t hi = (size_t)(pg + PAGE - (uintptr_t)f->cpu);
                hi = hi < f->n ? hi : f->n;
                if (cpu_in_flight(w, i, lo, hi, NULL))
                    memset(skip + lo, 1, hi - lo);
            }
        }
        bool flying = false;
        for (int s = 0; s < NSIDE; s++)
            flying |= any[s];
        /* Under ThreadSanitizer only families with nothing in flight:
         * reading the bytes beside a queued copy (the bytes in flight are
         * skipped) is a race on the buffer to TSan. They are checked once
         * the flights complete. */
        if (TEST_TSAN && flying)
            continue;
        /* The CPU. */
        if (any[0] || memcmp(f->cpu, f->mem[0], f->n) != 0)
            for (size_t b = 0; b < f->n; b++)
                if ((!any[0] || !skip[b]) && f->cpu[b] != f->mem[0][b])
                    fail(w, "family %d: CPU byte %zu is 0x%02x, the model says 0x%02x (%s on the CPU)", i, b, f->cpu[b],
                         f->mem[0][b], f->valid[0][b] ? "valid" : "stale");
        w->bytes_checked += f->n;
        /* Each device side, read back raw. */
        for (int j = 0; j < f->ndev; j++) {
            int s = 1 + j;
            if (!f->gbuf[j])
                continue; /* evicted: nothing to compare */
            EXPECT(w, mapping_sync_to_cpu_range(NULL, f->gbuf[j], f->goff[j], w->scratch, f->n), MAPPING_OK);
            w->bytes_checked += f->n;
            if (!any[s] && f->all_known[s] && memcmp(w->scratch, f->mem[s], f->n) == 0)
                continue;
            const unsigned char *sk = skip + (size_t)s * f->n;
            for (size_t b = 0; b < f->n; b++)
                if (f->known[s][b] && (!any[s] || !sk[b]) && w->scratch[b] != f->mem[s][b])
                    fail(w, "family %d: device side %d byte %zu is 0x%02x, the model says 0x%02x (%s there)", i, j, b,
                         w->scratch[b], f->mem[s][b], f->valid[s][b] ? "valid" : "stale");
        }
    }
}


/* ---- handles and ranges ---- */

/* A range [*lo, *hi) of handle k, in family offsets. */
static void pick_range(world *w, const fam *f, int k, size_t *lo, size_t *hi)
{
    size_t len = f->hlen[k], n;
    switch (pick(w, 8)) {
    case 0:
    case 1:
        n = 1 + pick(w, 8);
        break;
    case 2:
    case 3:
        n = 1 + pick(w, 300);
        break;
    case 4:
    case 5:
        n = 1 + pick(w, 2 * PAGE);
        break;
    case 6:
        n = len;
        break;
    default: /* a page, aligned within the family */
        n = PAGE;
        break;
    }
    n = n < len ? n : len;
    size_t off = pick(w, len - n + 1);
    *lo = f->hoff[k] + off;
    *hi = *lo + n;
}

static int pick_handle(world *w, const fam *f)
{
    return (int)pick(w, (size_t)f->nh);
}

/* ---- CPU writes ---- */

static void op_sync(world *w, int to_cpu, int final, int fi_forced, int side_forced);
static void do_sync(world *w, int to_cpu, int fi, int k, int j, mstream *ms, int carried_tc);

typedef struct wjob {
    volatile unsigned char *dst;
    const unsigned char    *src, *mask, *restore;
    size_t                  len;
} wjob;

static void run_job(void *arg)
{
    wjob *j = arg;
    for (size_t i = 0; i < j->len; i++)
        if (!j->mask || j->mask[i])
            j->dst[i] = j->src[i];
    if (j->restore)
        for (size_t i = 0; i < j->len; i++)
            if (!j->mask || j->mask[i])
                j->dst[i] = j->restore[i];
}

static void *job_thread(void *arg)
{
    run_job(arg);
    return NULL;
}

static const char *const writer_names[] = {"by the main thread", "by another thread", "by a host function"};

/* Writes w->src (where w->mask, if any) into the CPU side at [lo, hi) by
 * writer 0 main thread, 1 another thread (joined), 2 a host function on
 * stream ms (then synchronized; NULL in a blocking cell: run at once), then
 * restores (restore). */
static void cpu_store(world *w, int fi, size_t lo, size_t hi, int writer, mstream *ms, bool masked, bool restore)
{
    fam *f = &w->f[fi];
    wjob job = {f->cpu + lo, w->src, masked ? w->mask : NULL, restore ? w->restore : NULL, hi - lo};
    if (restore) /* what the bytes hold when the writer runs (a copy queued before a host function may land first) */
        memcpy(w->restore, f->mem[0] + lo, hi - lo);
    if (writer == 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, job_thread, &job) != 0 || pthread_join(t, NULL) != 0)
            fail(w, "pthread_create/join failed");
    } else if (writer == 2) {
        if (!ms)
            EXPECT(w, mapping_launch_host(NULL, run_job, &job), MAPPING_OK);
        else {
            EXPECT(w, mapping_launch_host(ms->s, run_job, &job), MAPPING_OK);
            stream_sync(w, ms, " (after the host function's write)");
        }
    } else {
        run_job(&job);
    }
    if (!restore)
        for (size_t b = lo; b < hi; b++)
            if (!masked || w->mask[b - lo])
                f->mem[0][b] = w->src[b - lo];
}

static void fill_src(world *w, size_t n, bool same_as, const unsigned char *cur)
{
    int kind = (int)pick(w, 3);
    unsigned char v = byte_value(w);
    for (size_t i = 0; i < n; i++)
        w->src[i] = same_as ? cur[i] : kind == 0 ? v : (unsigned char)(rnd(w) >> 32);
}

/* A CPU write: marked (write, then mark_cpu_modified), or on a tracked
 * family unmarked (the tracker's), from any writer. */
static void op_cpu_write(world *w)
{
    int fi = (int)pick(w, (size_t)w->nf);
    fam *f = &w->f[fi];
    int k = pick_handle(w, f);
    size_t lo, hi;
    pick_range(w, f, k, &lo, &hi);
    int writer = (int)pick(w, 3);
    /* A host function goes on a stream of the family's device: copies queued
     * there before it are ordered with it (it may write their pages); those
     * of other streams are not. */
    mstream *ms = writer == 2 && w->c.streams ? stream_of(w, f->dev[pick(w, (size_t)f->ndev)], (int)pick(w, NSTREAM))
                                              : NULL;
    if (cpu_in_flight(w, fi, lo, hi, ms))
        sync_all_streams(w, " (before a CPU write near queued copies)");
    bool marked = !f->tracked || pick(w, 10) < 3;
    if (marked) {
        bool conflict = model_conflict(f, 0, lo, hi);
        if (conflict && pick(w, 2)) { /* sync first, as a program would */
            trace(w, "family %d: the CPU write's mark would conflict: a blocking sync to the CPU first", fi);
            do_sync(w, 1, fi, k, 0, NULL, 0);
            conflict = model_conflict(f, 0, lo, hi);
        }
        if (!conflict) {
            fill_src(w, hi - lo, pick(w, 8) == 0, f->mem[0] + lo);
            cpu_store(w, fi, lo, hi, writer, ms, false, false);
            if (!f->tracked) /* the mark below is what tells the library */
                memcpy(f->base + lo, f->mem[0] + lo, hi - lo);
        }
        trace(w, "family %d handle %d: CPU write [%zu, %zu) %s, then mark_cpu_modified%s", fi, k, lo, hi,
              writer_names[writer], conflict ? " (no write: the mark conflicts)" : "");
        uint64_t c0 = conflicts_now(w);
        int tc = model_collect(w, f);
        mapping_status st = f->multi ? mapping_multimirror_mark_cpu_modified(f->mm, lo, hi - lo)
                                     : mapping_mirror_mark_cpu_modified(f->h[k], lo - f->hoff[k], hi - lo);
        if (st != (conflict ? MAPPING_ERR_CONFLICT : MAPPING_OK))
            fail(w, "mark_cpu_modified([%zu, %zu)) returned %s, the model says %s (%s)", lo, hi, mapping_status_name(st),
                 conflict ? "ERR_CONFLICT" : "OK", st ? mapping_last_error_message() : "");
        if (!conflict)
            model_mark(f, 0, lo, hi);
        check_conflicts(w, c0, conflict, tc);
        return;
    }
    /* Unmarked, tracked: random bytes, the same bytes again, or a write undone
     * before the next call; over CPU-stale bytes or around them. */
    int kind = (int)pick(w, 8);
    bool same = kind == 0, restore = kind == 1;
    bool masked = w->legacy || pick(w, 4) != 0; /* write only bytes valid on the CPU */
    size_t stale_in = 0;
    for (size_t b = lo; b < hi; b++) {
        w->mask[b - lo] = f->valid[0][b];
        stale_in += !f->valid[0][b];
    }
    masked = masked && stale_in;
    fill_src(w, hi - lo, same, f->mem[0] + lo);
    trace(w, "family %d: tracked CPU write [%zu, %zu) %s%s%s%s", fi, lo, hi, writer_names[writer],
          same ? ", the same bytes again" : "", restore ? ", undone before the next call" : "",
          masked ? ", only where valid on the CPU" : stale_in ? ", over CPU-stale bytes too" : "");
    cpu_store(w, fi, lo, hi, writer, ms, masked, restore);
}

/* ---- device writes ---- */

static void device_store(world *w, fam *f, int j, mapping_stream *s, size_t lo, size_t hi)
{
    int s1 = 1 + j;
    if (s || pick(w, 2)) { /* on a stream a fill (its value is taken when queued) */
        unsigned char v = byte_value(w);
        EXPECT(w, mapping_fill_gpu(s, f->gbuf[j], f->goff[j] + lo, hi - lo, v), MAPPING_OK);
        memset(f->mem[s1] + lo, v, hi - lo);
    } else {
        fill_src(w, hi - lo, false, NULL);
        EXPECT(w, mapping_sync_to_gpu_range(NULL, w->src, f->gbuf[j], f->goff[j] + lo, hi - lo), MAPPING_OK);
        memcpy(f->mem[s1] + lo, w->src, hi - lo);
    }
    memset(f->known[s1] + lo, 1, hi - lo);
    refresh_known(f, s1);
}


/* MAPPING_MODEL_LEGACY=1: the old contract asked for the CPU's tracked
 * writes to be synced before the device side is marked. */
static void legacy_presync(world *w, int fi, int j)
{
    if (w->legacy && w->f[fi].tracked)
        op_sync(w, 0, 1, fi, j);
}

/* A device write (raw, blocking) then mark_gpu_modified; or the mark alone. */
static void op_gpu_write(world *w, bool write)
{
    int fi = (int)pick(w, (size_t)w->nf);
    fam *f = &w->f[fi];
    int k = f->multi ? 0 : pick_handle(w, f);
    int j = (int)pick(w, (size_t)f->ndev);
    legacy_presync(w, fi, j);
    size_t lo, hi;
    pick_range(w, f, k, &lo, &hi);
    if (write && dev_in_flight(w, fi, j, lo, hi))
        sync_all_streams(w, " (before a device write near queued work)");
    /* The mark's call collects first: do it now (nothing changes the CPU
     * side in between), so the conflict is predicted on the state it meets. */
    int tc = model_collect(w, f);
    bool conflict = model_conflict(f, 1 + j, lo, hi);
    if (conflict && pick(w, 2)) { /* sync first, as a program would: a queued sync counts as synced */
        mstream *ms = write ? NULL : choose_stream(w, f->dev[j]);
        trace(w, "family %d: the mark would conflict: a sync to device side %d first", fi, j);
        do_sync(w, 0, fi, k, j, ms, tc);
        tc = 0;
        conflict = model_conflict(f, 1 + j, lo, hi);
    }
    /* Evicted (budgets): no device bytes to write or mark; the mark is refused. */
    bool gone = !f->res[j];
    if (write && !conflict && !gone)
        device_store(w, f, j, NULL, lo, hi);
    trace(w, "family %d handle %d: %smark_gpu_modified(side %d, [%zu, %zu))%s", fi, k,
          write && !conflict && !gone ? "device write, then " : "", j, lo, hi,
          gone ? ": not resident, the model says INVALID_ARGUMENT" : conflict ? ": the model says CONFLICT" : "");
    uint64_t c0 = conflicts_now(w);
    mapping_status st = f->multi ? mapping_multimirror_mark_gpu_modified(f->mm, j, lo, hi - lo)
                                 : mapping_mirror_mark_gpu_modified(f->h[k], lo - f->hoff[k], hi - lo);
    mapping_status want = gone ? MAPPING_ERR_INVALID_ARGUMENT : conflict ? MAPPING_ERR_CONFLICT : MAPPING_OK;
    if (st != want)
        fail(w, "mark_gpu_modified(side %d, [%zu, %zu)) returned %s, the model says %s (%s)", j, lo, hi,
             mapping_status_name(st), mapping_status_name(want), st ? mapping_last_error_message() : "");
    if (!conflict && !gone) {
        model_mark(f, 1 + j, lo, hi);
        if (!write)
            learn_device(w, f, j, lo, hi); /* the mark says the device holds them, whatever they are */
    }
    check_conflicts(w, c0, conflict && !gone, tc);
}

/* A CPU mark alone (the content unchanged). */
static void op_cpu_mark(world *w)
{
    int fi = (int)pick(w, (size_t)w->nf);
    fam *f = &w->f[fi];
    int k = f->multi ? 0 : pick_handle(w, f);
    size_t lo, hi;
    pick_range(w, f, k, &lo, &hi);
    if (model_conflict(f, 0, lo, hi) && pick(w, 2)) { /* sync first: a queued sync counts as synced */
        trace(w, "family %d: the CPU mark would conflict: a sync to the CPU first", fi);
        do_sync(w, 1, fi, k, 0, choose_stream(w, f->dev[0]), 0);
    }
    uint64_t c0 = conflicts_now(w);
    int tc = model_collect(w, f);
    bool conflict = model_conflict(f, 0, lo, hi);
    trace(w, "family %d handle %d: mark_cpu_modified([%zu, %zu)) alone%s", fi, k, lo, hi,
          conflict ? ": the model says CONFLICT" : "");
    mapping_status st = f->multi ? mapping_multimirror_mark_cpu_modified(f->mm, lo, hi - lo)
                                 : mapping_mirror_mark_cpu_modified(f->h[k], lo - f->hoff[k], hi - lo);
    if (st != (conflict ? MAPPING_ERR_CONFLICT : MAPPING_OK))
        fail(w, "mark_cpu_modified([%zu, %zu)) returned %s, the model says %s (%s)", lo, hi, mapping_status_name(st),
             conflict ? "ERR_CONFLICT" : "OK", st ? mapping_last_error_message() : "");
    if (!conflict)
        model_mark(f, 0, lo, hi);
    check_conflicts(w, c0, conflict, tc);
}

/* ---- syncs ---- */

typedef struct stats_pair {
    mapping_stats before;
    int           dev, armed;
} stats_pair;

static void stats_begin(world *w, stats_pair *p, int dev)
{
    p->dev = dev;
    p->armed = device_idle(w, dev);
    if (p->armed)
        EXPECT(w, mapping_device_stats(w->dev[dev], &p->before), MAPPING_OK);
}

/* The bytes a blocking sync moved: payload at most the model's stale bytes
 * (with the diff: the bytes of the 4 KiB blocks holding them); nothing at
 * all when nothing was stale. Multimirror syncs are not payload: their
 * driver bytes (and peer bytes) at most the stale bytes and merged gaps. */
static void stats_end(world *w, stats_pair *p, const fam *f, int to_cpu, const sync_plan *plan, const char *what)
{
    if (!p->armed)
        return;
    mapping_stats a;
    EXPECT(w, mapping_device_stats(w->dev[p->dev], &a), MAPPING_OK);
    w->stats_checks++;
    const mapping_stats *b = &p->before;
    unsigned long long pay = to_cpu ? a.d2h_payload_bytes - b->d2h_payload_bytes : a.h2d_payload_bytes - b->h2d_payload_bytes;
    if (to_cpu) /* an eviction the call made (a diff's shadow wanted room) wrote back too */
        pay -= a.evict_writeback_bytes - b->evict_writeback_bytes;
    unsigned long long drv = to_cpu ? a.d2h_bytes - b->d2h_bytes : a.h2d_bytes - b->h2d_bytes;
    unsigned long long peer = a.peer_bytes - b->peer_bytes;
    bool relaxed = w->page_granular && f->tracked;
    if (plan->stale == 0 && !relaxed) {
        if (pay || drv || peer)
            fail(w, "%s: nothing was stale, yet the sync moved %llu bytes (payload %llu, peer %llu)", what, drv, pay,
                 peer);
        return;
    }
    if (relaxed)
        return;
    if (f->multi) { /* peer copies merge by the pair's measured link: any gap inside the stale bytes' span */
        if (!to_cpu && (drv > plan->bound || peer > plan->hi - plan->lo))
            fail(w, "%s: moved %llu bytes from the host and %llu from a peer; the %zu stale bytes span %zu (merged "
                    "gaps under 64 bytes: %zu)", what, drv, peer, plan->stale, plan->hi - plan->lo, plan->bound);
        return;
    }
    size_t limit = f->diff && to_cpu ? plan->blocks : plan->stale;
    if (pay > limit)
        fail(w, "%s: payload %llu bytes, more than the model's %zu stale bytes%s", what, pay, plan->stale,
             f->diff && to_cpu ? " rounded up to 4 KiB blocks" : "");
}

/* A sync of handle k of family fi to the CPU or device side j, on ms (NULL:
 * blocking). carried_tc: a tracked conflict the model already collected
 * for this call (the library finds it here). */
static void do_sync(world *w, int to_cpu, int fi, int k, int j, mstream *ms, int carried_tc)
{
    fam *f = &w->f[fi];
    int target = to_cpu ? 0 : 1 + j;
    int dev = f->dev[j];
    if (f->multi && to_cpu)
        ms = NULL; /* blocking only */
    size_t lo = f->hoff[k], hi = lo + f->hlen[k];
    stats_pair sp = {0};
    int sdev = f->multi && to_cpu ? -1 : dev;
    if (sdev >= 0)
        stats_begin(w, &sp, sdev);
    mapping_stats mb[MAXDEV];
    bool multi_cpu_armed = sdev < 0 && device_idle(w, f->dev[0]) && (f->ndev < 2 || device_idle(w, f->dev[1]));
    if (sdev < 0)
        for (int d = 0; d < f->ndev; d++)
            EXPECT(w, mapping_device_stats(w->dev[f->dev[d]], &mb[d]), MAPPING_OK);
    uint64_t c0 = conflicts_now(w);
    int tc = model_collect(w, f) | carried_tc;
    bool remake = !to_cpu && !f->res[j]; /* evicted: the sync makes the device side again, if there is room */
    if (remake)
        model_save(w, f);
    sync_plan plan = model_sync(f, target, lo, hi);
    trace(w, "family %d handle %d: sync to %s%s%s [%zu, %zu): %zu stale%s", fi, k, to_cpu ? "the CPU" : "device side ",
          to_cpu ? "" : (j ? "1" : "0"), ms ? " on a stream" : " (blocking)", lo, hi, plan.stale,
          remake ? " (not resident)" : "");
    mapping_status st;
    if (f->multi)
        st = to_cpu ? mapping_multimirror_sync_to_cpu(f->mm) : mapping_multimirror_sync_to_gpu(ms ? ms->s : NULL, f->mm, j);
    else
        st = (to_cpu ? mapping_mirror_sync_to_cpu : mapping_mirror_sync_to_gpu)(ms ? ms->s : NULL, f->h[k]);
    if (st != MAPPING_OK && remake) {
        check_no_room(w, f, j, st, "sync to the GPU");
        check_conflicts(w, c0, 0, tc);
        return;
    }
    if (st != MAPPING_OK)
        fail(w, "sync to %s returned %s (%s)", to_cpu ? "the CPU" : "the GPU", mapping_status_name(st),
             mapping_last_error_message());
    check_conflicts(w, c0, 0, tc);
    w->syncs++;
    if (!to_cpu) {
        refresh_known(f, target);
    }
    if (ms && (plan.stale || (w->page_granular && f->tracked))) {
        int sides = f->multi ? (1 << nsides(f)) - 1 : 1 | (2 << j);
        if ((w->page_granular && f->tracked) || f->multi) /* whole pages the model has in sync; peer merges */
            add_flight(w, ms, fi, sides, lo, hi);
        else
            add_flight(w, ms, fi, sides, plan.lo, plan.hi);
        w->stream_ops++;
    }
    if (!ms && sdev >= 0)
        stats_end(w, &sp, f, to_cpu, &plan, to_cpu ? "blocking sync to the CPU" : "blocking sync to the GPU");
    if (sdev < 0 && multi_cpu_armed && !(w->page_granular && f->tracked)) {
        unsigned long long moved = 0;
        for (int d = 0; d < f->ndev; d++) {
            mapping_stats a;
            EXPECT(w, mapping_device_stats(w->dev[f->dev[d]], &a), MAPPING_OK);
            moved += a.d2h_bytes - mb[d].d2h_bytes;
        }
        w->stats_checks++;
        if (moved > plan.bound)
            fail(w, "multimirror sync to the CPU moved %llu bytes, more than the %zu stale bytes and merged gaps (%zu)",
                 moved, plan.stale, plan.bound);
    }
}

static void op_sync(world *w, int to_cpu, int final, int fi_forced, int side_forced)
{
    int fi = fi_forced >= 0 ? fi_forced : (int)pick(w, (size_t)w->nf);
    fam *f = &w->f[fi];
    int k = f->multi || final ? 0 : pick_handle(w, f);
    int j = side_forced >= 0 ? side_forced : (int)pick(w, (size_t)f->ndev);
    mstream *ms = final || (f->multi && to_cpu) ? NULL : choose_stream(w, f->dev[j]);
    do_sync(w, to_cpu, fi, k, j, ms, 0);
}

static void op_stream_sync(world *w)
{
    if (!w->c.streams)
        return;
    mstream *best = NULL;
    for (int i = 0; i < w->ndev * NSTREAM; i++)
        if (w->st[i].nf && (!best || pick(w, 2)))
            best = &w->st[i];
    if (!best)
        best = &w->st[pick(w, (size_t)(w->ndev * NSTREAM))];
    stream_sync(w, best, "");
}

/* ---- access intents ---- */

static const char *access_name(unsigned a)
{
    return a == MAPPING_READ ? "READ" : a == MAPPING_WRITE ? "WRITE (discard)" : "READ|WRITE";
}

static void op_acquire_cpu(world *w)
{
    int fi = (int)pick(w, (size_t)w->nf);
    fam *f = &w->f[fi];
    if (f->multi)
        return;
    int k = pick_handle(w, f);
    unsigned access = 1 + (unsigned)pick(w, 3);
    size_t lo = f->hoff[k], hi = lo + f->hlen[k];
    stats_pair sp = {0};
    stats_begin(w, &sp, f->dev[0]);
    uint64_t c0 = conflicts_now(w);
    int tc = model_collect(w, f);
    sync_plan plan = {0};
    if (access & MAPPING_READ)
        plan = model_sync(f, 0, lo, hi);
    if (access & MAPPING_WRITE)
        model_mark(f, 0, lo, hi);
    trace(w, "family %d handle %d: acquire_cpu(%s) [%zu, %zu)", fi, k, access_name(access), lo, hi);
    void *ptr = NULL;
    EXPECT(w, mapping_mirror_acquire_cpu(f->h[k], access, &ptr), MAPPING_OK);
    if (ptr != f->cpu + lo)
        fail(w, "acquire_cpu gave %p, the view's host address is %p", ptr, (void *)(f->cpu + lo));
    check_conflicts(w, c0, 0, tc);
    if (access & MAPPING_READ)
        stats_end(w, &sp, f, 1, &plan, "acquire_cpu(READ)");
    /* Then the program writes: marked by the acquire (WRITE), or tracked. */
    if ((access & MAPPING_WRITE) || (f->tracked && pick(w, 2))) {
        size_t a, b;
        if (access == MAPPING_WRITE && pick(w, 2)) {
            a = lo;
            b = hi;
        } else {
            pick_range(w, f, k, &a, &b);
        }
        if (cpu_in_flight(w, fi, a, b, NULL))
            return; /* a neighbour's queued copy: leave it */
        fill_src(w, b - a, false, NULL);
        trace(w, "family %d: the program writes [%zu, %zu) through the acquired pointer", fi, a, b);
        cpu_store(w, fi, a, b, 0, NULL, false, false);
        if (!f->tracked)
            memcpy(f->base + a, f->mem[0] + a, b - a); /* marked by the acquire */
    }
}

static void op_acquire_gpu(world *w)
{
    int fi = (int)pick(w, (size_t)w->nf);
    fam *f = &w->f[fi];
    if (f->multi)
        return;
    int k = pick_handle(w, f);
    unsigned access = 1 + (unsigned)pick(w, 3);
    mstream *ms = choose_stream(w, f->dev[0]);
    size_t lo = f->hoff[k], hi = lo + f->hlen[k];
    legacy_presync(w, fi, 0);
    uint64_t c0 = conflicts_now(w);
    int tc = model_collect(w, f);
    bool remake = !f->res[0]; /* evicted: the acquire makes the device side again, if there is room */
    if (remake)
        model_save(w, f);
    sync_plan plan = {0};
    if (access & MAPPING_READ)
        plan = model_sync(f, 1, lo, hi);
    if (access & MAPPING_WRITE)
        model_mark(f, 1, lo, hi);
    trace(w, "family %d handle %d: acquire_gpu(%s)%s [%zu, %zu)%s", fi, k, access_name(access),
          ms ? " on a stream" : " (blocking)", lo, hi, remake ? " (not resident)" : "");
    mapping_buffer *buf = NULL;
    mapping_status st = mapping_mirror_acquire_gpu(ms ? ms->s : NULL, f->h[k], access, &buf);
    if (st != MAPPING_OK && remake) {
        check_no_room(w, f, 0, st, "acquire_gpu");
        check_conflicts(w, c0, 0, tc);
        return;
    }
    EXPECT(w, st, MAPPING_OK);
    check_conflicts(w, c0, 0, tc);
    if (buf != f->gbuf[0])
        fail(w, "acquire_gpu gave buffer %p, the mirror's is %p", (void *)buf, (void *)f->gbuf[0]);
    if (access & MAPPING_WRITE)
        learn_device(w, f, 0, lo, hi); /* marked: what the device holds (a buffer made again holds anything) */
    refresh_known(f, 1);
    if (ms && w->page_granular && f->tracked && (access & MAPPING_READ))
        add_flight(w, ms, fi, 1 | 2, lo, hi);
    else if (ms && plan.stale)
        add_flight(w, ms, fi, 1 | 2, plan.lo, plan.hi);
    if (access & MAPPING_WRITE) { /* the device's work, on the same stream */
        size_t a, b;
        if (access == MAPPING_WRITE && pick(w, 2)) {
            a = lo;
            b = hi;
        } else {
            pick_range(w, f, k, &a, &b);
        }
        if (!ms && dev_in_flight(w, fi, 0, a, b))
            sync_all_streams(w, " (before a blocking device write near queued work)");
        trace(w, "family %d: the device writes [%zu, %zu)%s", fi, a, b, ms ? " on the stream" : "");
        device_store(w, f, 0, ms ? ms->s : NULL, a, b);
        if (ms)
            add_flight(w, ms, fi, 2, a, b);
    }
    c0 = conflicts_now(w);
    tc = model_collect(w, f);
    trace(w, "family %d handle %d: release_gpu", fi, k);
    EXPECT(w, mapping_mirror_release_gpu(ms ? ms->s : NULL, f->h[k]), MAPPING_OK);
    check_conflicts(w, c0, 0, tc);
}

static void op_release(world *w)
{
    int fi = (int)pick(w, (size_t)w->nf);
    fam *f = &w->f[fi];
    if (f->multi)
        return;
    int k = pick_handle(w, f);
    mstream *ms = choose_stream(w, f->dev[0]);
    uint64_t c0 = conflicts_now(w);
    int tc = model_collect(w, f);
    trace(w, "family %d handle %d: release_gpu%s alone", fi, k, ms ? " on a stream" : "");
    EXPECT(w, mapping_mirror_release_gpu(ms ? ms->s : NULL, f->h[k]), MAPPING_OK);
    check_conflicts(w, c0, 0, tc);
}

/* ---- queries ---- */

static void op_query(world *w, bool needs)
{
    int fi = (int)pick(w, (size_t)w->nf);
    fam *f = &w->f[fi];
    int k = f->multi ? 0 : pick_handle(w, f);
    int side = (int)pick(w, (size_t)nsides(f));
    size_t lo = f->hoff[k], hi = lo + f->hlen[k];
    uint64_t c0 = conflicts_now(w);
    int tc = model_collect(w, f);
    size_t want = model_stale(f, side, lo, hi);
    bool relaxed = w->page_granular && f->tracked;
    w->stale_queries++;
    if (needs && !f->multi) {
        int out = -1;
        EXPECT(w, mapping_mirror_needs_sync(f->h[k], side ? MAPPING_GPU : MAPPING_CPU, &out), MAPPING_OK);
        trace(w, "family %d handle %d: needs_sync(%s) = %d, the model says %d", fi, k, side ? "GPU" : "CPU", out,
              want != 0);
        if (relaxed ? (want && out != 1) : out != (want != 0))
            fail(w, "needs_sync(%s) of [%zu, %zu) = %d; the model has %zu stale bytes there", side ? "GPU" : "CPU", lo,
                 hi, out, want);
    } else {
        size_t got = f->multi ? mapping_multimirror_stale_bytes(f->mm, side - 1)
                              : mapping_mirror_stale_bytes(f->h[k], side ? MAPPING_GPU : MAPPING_CPU);
        trace(w, "family %d handle %d: stale_bytes(side %d) = %zu, the model says %zu", fi, k, side, got, want);
        if (relaxed ? got < want : got != want)
            fail(w, "stale_bytes(side %d) of [%zu, %zu) = %zu, the model says %zu", side, lo, hi, got, want);
    }
    check_conflicts(w, c0, 0, tc);
}

/* ---- a sequence ---- */

static void fam_alloc_model(world *w, fam *f)
{
    for (int s = 0; s < nsides(f); s++) {
        f->mem[s] = calloc(1, f->n);
        f->known[s] = calloc(1, f->n);
        f->valid[s] = calloc(1, f->n);
        f->mod[s] = calloc(1, f->n);
        if (!f->mem[s] || !f->known[s] || !f->valid[s] || !f->mod[s])
            fail(w, "out of memory");
        f->all_known[s] = s == 0;
    }
    f->base = malloc(f->n);
    if (!f->base)
        fail(w, "out of memory");
    memcpy(f->mem[0], f->cpu, f->n);
    memcpy(f->base, f->cpu, f->n);
    memset(f->known[0], 1, f->n);
    memset(f->valid[0], 1, f->n);
}

static void fam_free(fam *f)
{
    for (int k = f->nh - 1; k >= 0; k--)
        mapping_mirror_destroy(f->h[k]);
    mapping_multimirror_destroy(f->mm);
    for (int s = 0; s < NSIDE; s++) {
        free(f->mem[s]);
        free(f->known[s]);
        free(f->valid[s]);
        free(f->mod[s]);
    }
    free(f->base);
    free(f->wrapped);
    memset(f, 0, sizeof *f);
}

static unsigned mirror_flags(world *w, fam *f)
{
    f->tracked = w->tracked;
    int coin = (int)pick(w, 2); /* drawn whatever the environment: the same seed, the same ops */
    f->diff = w->diff_env == 1 || coin;
    return (f->tracked ? MAPPING_MIRROR_TRACK_WRITES : 0u) | (f->diff ? MAPPING_MIRROR_DEVICE_DIFF : 0u);
}

static void setup_mirror_family(world *w, fam *f, int dev, size_t n, bool wrap)
{
    f->n = n;
    f->ndev = 1;
    f->dev[0] = dev;
    unsigned flags = mirror_flags(w, f);
    if (wrap) {
        size_t cap = (n + PAGE - 1) / PAGE * PAGE;
        f->wrapped = aligned_alloc(PAGE, cap);
        if (!f->wrapped)
            fail(w, "out of memory");
        for (size_t i = 0; i < cap; i++)
            ((unsigned char *)f->wrapped)[i] = (unsigned char)(i * 7 + 3);
        EXPECT(w, mapping_mirror_wrap(w->dev[dev], f->wrapped, n, flags, &f->h[0]), MAPPING_OK);
    } else {
        EXPECT(w, mapping_mirror_create(w->dev[dev], n, flags, &f->h[0]), MAPPING_OK);
    }
    f->cpu = mapping_mirror_cpu(f->h[0]);
    if (!wrap)
        for (size_t i = 0; i < n; i++)
            if (f->cpu[i])
                fail(w, "mapping_mirror_create: CPU byte %zu is 0x%02x, not zero", i, f->cpu[i]);
    f->gbuf[0] = mapping_mirror_gpu(f->h[0]);
    f->goff[0] = mapping_mirror_gpu_offset(f->h[0]);
    f->hoff[0] = 0;
    f->hlen[0] = n;
    f->nh = 1;
    fam_alloc_model(w, f);
}

/* Device d's budget: from `least` (a family fits) to least + span (often
 * less than the working set). */
static void set_budget(world *w, int d, size_t least, size_t span)
{
    w->budget[d] = least + pick(w, span + 1);
    EXPECT(w, mapping_device_set_memory_budget(w->dev[d], w->budget[d]), MAPPING_OK);
}

static void setup(world *w)
{
    w->nf = 0;
    size_t tail = pick(w, 8) == 0 ? 0 : 1 + pick(w, PAGE - 1);
    if (w->legacy && w->tracked)
        tail = 0; /* legacy: the library's odd-sized tracked allocations share their last page with the heap */
    size_t n = (1 + pick(w, 4)) * PAGE + tail;
    if (n == 0)
        n = 1;
    int dev = (int)pick(w, (size_t)w->ndev);
    switch (w->c.shape) {
    case SHAPE_WHOLE:
    case SHAPE_VIEWS: {
        /* Under a budget, a second family on the same device: a call on one
         * may evict the other. */
        size_t n1 = w->budget_on ? (1 + pick(w, 2)) * PAGE + pick(w, PAGE) : 0;
        if (n1)
            set_budget(w, dev, n > n1 ? n : n1, n + n1);
        fam *f = &w->f[w->nf++];
        setup_mirror_family(w, f, dev, n, pick(w, 3) == 0);
        if (w->c.shape == SHAPE_VIEWS)
            for (int k = 1; k < MAXH; k++) {
                size_t len = 1 + pick(w, n), off = pick(w, n - len + 1);
                if (pick(w, 3) == 0 && k > 1) { /* a view of a view */
                    size_t plen = f->hlen[k - 1], poff = f->hoff[k - 1];
                    len = 1 + pick(w, plen);
                    off = poff + pick(w, plen - len + 1);
                    EXPECT(w, mapping_mirror_view(f->h[k - 1], off - poff, len, &f->h[k]), MAPPING_OK);
                } else {
                    EXPECT(w, mapping_mirror_view(f->h[0], off, len, &f->h[k]), MAPPING_OK);
                }
                f->hoff[k] = off;
                f->hlen[k] = len;
                if (mapping_mirror_gpu_offset(f->h[k]) != f->goff[0] + off)
                    fail(w, "view at %zu: gpu offset %zu", off, mapping_mirror_gpu_offset(f->h[k]));
                f->nh++;
            }
        if (n1)
            setup_mirror_family(w, &w->f[w->nf++], dev, n1, pick(w, 3) == 0);
        break;
    }
    case SHAPE_SHARDED: {
        /* Two shards (on the world's two devices) of the caller's array; the
         * first ends on a page where tracked (a page of two tracked families
         * is refused), the second ends with an odd tail. */
        size_t pages = 1 + pick(w, 2), total = 2 * pages * PAGE - pick(w, 2);
        if (!w->tracked && pick(w, 2))
            total = 2 + pick(w, 4 * PAGE);
        size_t cap = (total + PAGE - 1) / PAGE * PAGE;
        unsigned char *mem = aligned_alloc(PAGE, cap);
        if (!mem)
            fail(w, "out of memory");
        for (size_t i = 0; i < cap; i++)
            mem[i] = (unsigned char)(i * 13 + 1);
        fam *f0 = &w->f[0], *f1 = &w->f[1];
        if (w->budget_on) /* one shard per device: each fits, evictions come from the budget ops */
            for (int d = 0; d < w->ndev; d++)
                set_budget(w, d, (total + 1) / 2, total);
        unsigned flags = mirror_flags(w, f0);
        f1->tracked = f0->tracked;
        f1->diff = f0->diff;
        mapping_mirror *shards[2] = {NULL, NULL};
        mapping_device *devs[2] = {w->dev[0], w->dev[w->ndev - 1]};
        EXPECT(w, mapping_mirror_create_sharded(devs, 2, mem, total, 1, flags, shards), MAPPING_OK);
        for (int i = 0; i < 2; i++) {
            fam *f = &w->f[i];
            f->h[0] = shards[i];
            f->n = mapping_mirror_size(shards[i]);
            f->cpu = mapping_mirror_cpu(shards[i]);
            f->ndev = 1;
            f->dev[0] = i == 0 ? 0 : w->ndev - 1;
            f->gbuf[0] = mapping_mirror_gpu(shards[i]);
            f->goff[0] = mapping_mirror_gpu_offset(shards[i]);
            f->hlen[0] = f->n;
            f->nh = 1;
            fam_alloc_model(w, f);
        }
        f0->wrapped = mem;
        if (f0->n + f1->n != total || f1->cpu != f0->cpu + f0->n)
            fail(w, "create_sharded: slices of %zu and %zu bytes for %zu", f0->n, f1->n, total);
        w->nf = 2;
        break;
    }
    default: { /* SHAPE_MULTI */
        fam *f = &w->f[w->nf++];
        f->multi = 1;
        f->n = n;
        f->ndev = 2;
        mapping_device *devs[2] = {w->dev[0], w->dev[w->ndev - 1]};
        f->dev[0] = 0;
        f->dev[1] = w->ndev - 1;
        if (w->budget_on) /* replicas count, and are never evicted */
            for (int d = 0; d < w->ndev; d++)
                set_budget(w, d, n, 2 * n);
        EXPECT(w, mapping_multimirror_create(devs, 2, n, &f->mm), MAPPING_OK);
        f->tracked = w->tracked;
        if (f->tracked)
            EXPECT(w, mapping_multimirror_track_writes(f->mm), MAPPING_OK);
        f->cpu = mapping_multimirror_cpu(f->mm);
        for (int j = 0; j < 2; j++)
            f->gbuf[j] = mapping_multimirror_gpu(f->mm, j);
        for (size_t i = 0; i < n; i++)
            if (f->cpu[i])
                fail(w, "mapping_multimirror_create: CPU byte %zu is 0x%02x, not zero", i, f->cpu[i]);
        f->hlen[0] = n;
        f->nh = 1;
        fam_alloc_model(w, f);
        break;
    }
    }
    size_t need = 0;
    for (int i = 0; i < w->nf; i++)
        need = need > w->f[i].n ? need : w->f[i].n;
    if (need > w->scratch_n) {
        free(w->scratch);
        free(w->src);
        free(w->mask);
        free(w->restore);
        w->scratch = malloc(need);
        w->src = malloc(need);
        w->mask = malloc(NSIDE * need);
        w->restore = malloc(need);
        if (!w->scratch || !w->src || !w->mask || !w->restore)
            fail(w, "out of memory");
        w->scratch_n = need;
    }
    /* Device memory starts with a known pattern (a stale side: the library
     * does not care what it holds), so every byte of every side is known;
     * under a budget, a family the next one's creation evicted has none. */
    for (int i = 0; i < w->nf; i++) {
        fam *f = &w->f[i];
        for (int j = 0; j < f->ndev; j++) {
            f->res[j] = resident_now(f, j);
            if (!f->res[j]) {
                f->gbuf[j] = NULL;
                continue;
            }
            if (!f->multi)
                f->gbuf[0] = mapping_mirror_gpu(f->h[0]);
            for (size_t b = 0; b < f->n; b++)
                f->mem[1 + j][b] = (unsigned char)(0xA5 ^ (b * 29) ^ (size_t)j);
            EXPECT(w, mapping_sync_to_gpu_range(NULL, f->mem[1 + j], f->gbuf[j], f->goff[j], f->n), MAPPING_OK);
            memset(f->known[1 + j], 1, f->n);
            f->all_known[1 + j] = 1;
        }
    }
    for (int i = 0; i < w->nf; i++)
        trace(w, "family %d: %s of %zu bytes at %p on device %d%s%s", i,
              w->f[i].multi ? "multimirror" : w->c.shape == SHAPE_SHARDED ? "shard" : w->f[i].wrapped ? "wrapped mirror"
                                                                                                      : "mirror",
              w->f[i].n, (void *)w->f[i].cpu, w->f[i].dev[0], w->f[i].tracked ? ", tracked" : "",
              w->f[i].diff ? ", device diff" : "");
    for (int k = 1; k < w->f[0].nh; k++)
        trace(w, "family 0 handle %d: view [%zu, %zu)", k, w->f[0].hoff[k], w->f[0].hoff[k] + w->f[0].hlen[k]);
    for (int d = 0; d < w->ndev && w->budget_on; d++)
        trace(w, "device %d: memory budget %llu bytes", d, (unsigned long long)w->budget[d]);
    for (int i = 0; i < w->nf; i++)
        if (!w->f[i].res[0])
            trace(w, "family %d: evicted by the next family's creation", i);
}

/* ---- budget ops ---- */

/* Evicts a family now (it waits for its queued work). */
static void op_evict(world *w)
{
    int fi = (int)pick(w, (size_t)w->nf);
    fam *f = &w->f[fi];
    int k = f->multi ? 0 : pick_handle(w, f), j = (int)pick(w, (size_t)f->ndev);
    uint64_t c0 = conflicts_now(w);
    int tc = model_collect(w, f);
    trace(w, "family %d handle %d: evict device side %d%s", fi, k, j, f->res[j] ? "" : " (not resident: nothing)");
    EXPECT(w, f->multi ? mapping_multimirror_evict(f->mm, j) : mapping_mirror_evict(f->h[k]), MAPPING_OK);
    check_conflicts(w, c0, 0, tc);
    if (f->res[j])
        fail(w, "evict: device side %d is still resident", j);
}

static void op_hint(world *w)
{
    static const mapping_residency hints[] = {MAPPING_RESIDENCY_DEFAULT, MAPPING_RESIDENCY_KEEP,
                                              MAPPING_RESIDENCY_EVICT_FIRST};
    static const char *const names[] = {"DEFAULT", "KEEP", "EVICT_FIRST"};
    int fi = (int)pick(w, (size_t)w->nf), h = (int)pick(w, 3);
    fam *f = &w->f[fi];
    if (f->multi)
        return;
    int k = pick_handle(w, f);
    uint64_t c0 = conflicts_now(w);
    int tc = model_collect(w, f);
    trace(w, "family %d handle %d: set_residency(%s)", fi, k, names[h]);
    EXPECT(w, mapping_mirror_set_residency(f->h[k], hints[h]), MAPPING_OK);
    check_conflicts(w, c0, 0, tc);
}

/* A plain buffer of the program's: allocated (it may evict families, or
 * find no room) or freed. */
static void op_pressure(world *w)
{
    int d = (int)pick(w, (size_t)w->ndev);
    uint64_t c0 = conflicts_now(w);
    if (w->press[d]) {
        trace(w, "device %d: free the plain buffer", d);
        mapping_free_gpu(w->press[d]);
        w->press[d] = NULL;
        return;
    }
    size_t n = 1 + pick(w, w->budget[d] ? (size_t)w->budget[d] / 2 : 4 * PAGE);
    mapping_status st = mapping_allocate_gpu(w->dev[d], n, &w->press[d]);
    trace(w, "device %d: allocate a plain buffer of %zu bytes: %s", d, n, mapping_status_name(st));
    if (st == MAPPING_ERR_OUT_OF_DEVICE_MEMORY && w->budget[d] &&
        strstr(mapping_last_error_message(), "memory budget")) {
        w->press[d] = NULL;
        w->oom_seen++;
    } else if (st != MAPPING_OK) {
        fail(w, "mapping_allocate_gpu(%zu) returned %s (%s)", n, mapping_status_name(st), mapping_last_error_message());
    }
    check_conflicts(w, c0, 0, 0);
}

/* A new budget for a device: none, one below its smallest family (its
 * syncs to the device fail for want of room, nothing lost), or from its
 * largest family to the working set. Lowering it evicts what it can now. */
static void op_set_budget(world *w)
{
    int d = (int)pick(w, (size_t)w->ndev);
    size_t most = 0, sum = 0, least = (size_t)-1;
    for (int i = 0; i < w->nf; i++) {
        const fam *f = &w->f[i];
        if (f->dev[0] != d && !(f->multi && f->dev[1] == d))
            continue;
        most = f->n > most ? f->n : most;
        least = f->n < least ? f->n : least;
        sum += f->n;
    }
    if (!sum)
        most = sum = least = 4 * PAGE;
    int kind = (int)pick(w, 8);
    uint64_t b = kind == 0 ? 0 : kind == 1 ? 1 + pick(w, least) : most + pick(w, sum + 1);
    uint64_t c0 = conflicts_now(w);
    trace(w, "device %d: set_memory_budget(%llu)%s", d, (unsigned long long)b,
          kind == 0 ? " (none)" : kind == 1 ? " (below a family)" : "");
    EXPECT(w, mapping_device_set_memory_budget(w->dev[d], b), MAPPING_OK);
    w->budget[d] = b;
    check_conflicts(w, c0, 0, 0);
}

static void op_budget(world *w)
{
    size_t op = pick(w, 10);
    if (op < 4)
        op_evict(w);
    else if (op < 5)
        op_hint(w);
    else if (op < 8)
        op_pressure(w);
    else
        op_set_budget(w);
}

/* No budget, no plain buffer: the end of a budget sequence. */
static void budgets_off(world *w)
{
    for (int d = 0; d < w->ndev; d++) {
        mapping_free_gpu(w->press[d]);
        w->press[d] = NULL;
        if (w->budget[d])
            EXPECT(w, mapping_device_set_memory_budget(w->dev[d], 0), MAPPING_OK);
        w->budget[d] = 0;
    }
}

static void step(world *w)
{
    if (w->budget_on && pick(w, 100) < 6) {
        op_budget(w);
        return;
    }
    size_t op = pick(w, 100);
    if (op < 22)
        op_cpu_write(w);
    else if (op < 34)
        op_gpu_write(w, true);
    else if (op < 37)
        op_gpu_write(w, false);
    else if (op < 40)
        op_cpu_mark(w);
    else if (op < 50)
        op_sync(w, 0, 0, -1, -1);
    else if (op < 60)
        op_sync(w, 1, 0, -1, -1);
    else if (op < 66)
        op_stream_sync(w);
    else if (op < 72)
        op_acquire_cpu(w);
    else if (op < 78)
        op_acquire_gpu(w);
    else if (op < 80)
        op_release(w);
    else if (op < 90)
        op_query(w, false);
    else
        op_query(w, true);
}

/* Everything synced both ways; then every side equals the model, and
 * nothing is stale. */
static void finish(world *w)
{
    w->step = -1;
    sync_all_streams(w, " (the end)");
    if (w->budget_on) /* room for every family: all of them are compared */
        budgets_off(w);
    for (int i = 0; i < w->nf; i++) {
        op_sync(w, 1, 1, i, 0);
        for (int j = 0; j < w->f[i].ndev; j++)
            op_sync(w, 0, 1, i, j);
    }
    check_memory(w);
    model_self_check(w);
    for (int i = 0; i < w->nf; i++) {
        fam *f = &w->f[i];
        for (int s = 0; s < nsides(f); s++) {
            size_t got = f->multi ? mapping_multimirror_stale_bytes(f->mm, s - 1)
                                  : mapping_mirror_stale_bytes(f->h[0], s ? MAPPING_GPU : MAPPING_CPU);
            if (got)
                fail(w, "family %d: %zu bytes stale on side %d after syncing everything both ways", i, got, s);
            if (s && memcmp(f->mem[s], f->mem[0], f->n) != 0)
                fail(w, "model: family %d side %d differs from the CPU after syncing everything", i, s);
        }
    }
}

static void cell_of_seed(world *w, unsigned seed)
{
    unsigned c = seed % NCELLS;
    w->c.shape = (int)(c % 4);
    w->c.streams = (int)(c / 4 % 2);
    w->c.race = (int)(c / 8 % 2);
}

static void begin_sequence(world *w)
{
    w->ntrace = 0;
    w->step = 0;
    for (int d = 0; d < w->ndev; d++)
        EXPECT(w, mapping_device_set_checks(w->dev[d], w->c.race ? MAPPING_DEVICE_CHECK_RACES : 0u), MAPPING_OK);
    /* Tracked where the process has a mechanism (fuzz input: mostly). */
    w->tracked = w->mechanism != MAPPING_TRACK_NONE && (!w->in || pick(w, 4) != 0);
    w->budget_on = pick(w, 2) == 0;
    w->budget_seqs += (unsigned)w->budget_on;
    trace(w, "seed %u: %s, %s, race checker %s%s", w->seed, shape_names[w->c.shape],
          w->c.streams ? "streams" : "blocking", w->c.race ? "on" : "off", w->budget_on ? ", memory budgets" : "");
    setup(w);
    for (int d = 0; d < w->ndev; d++) { /* evictions from here on are the model's to check */
        mapping_stats st;
        EXPECT(w, mapping_device_stats(w->dev[d], &st), MAPPING_OK);
        w->wb_seen[d] = st.evict_writeback_bytes;
    }
    check_memory(w);
}

static void end_sequence(world *w)
{
    finish(w);
    for (int i = 0; i < w->nf; i++)
        fam_free(&w->f[i]);
    w->nf = 0;
}

/* One seeded sequence of `steps` steps. */
#ifndef MIRROR_MATRIX_FUZZ
/* Each step draws from its own generator (seed, step): a step left out by
 * a reduction leaves the others' choices as they were. */
static void seed_rng(world *w, unsigned seed, int at)
{
    w->rng = 0x9E3779B97F4A7C15ull ^ ((unsigned long long)seed * 0xD1B54A32D192ED03ull) ^
             ((unsigned long long)(unsigned)at * 0xA0761D6478BD642Full);
    if (!w->rng)
        w->rng = 1;
    rnd(w);
    rnd(w);
}

static void run_seed(world *w, unsigned seed, int steps)
{
    w->seed = seed;
    seed_rng(w, seed, 0);
    cell_of_seed(w, seed);
    begin_sequence(w);
    for (w->step = 1; w->step <= steps; w->step++) {
        seed_rng(w, seed, w->step);
        if (w->keep && !w->keep[w->step])
            continue;
        step(w);
        check_memory(w);
        if (w->step % 32 == 0)
            model_self_check(w);
        w->steps_total++;
    }
    end_sequence(w);
}
#endif

/* ---- the world's devices ---- */

static int world_open(world *w, mapping_device *given0, mapping_device *given1)
{
    const char *backend = env_or("MAPPING_BACKEND", "host");
    const char *diff = env_or("MAPPING_DEVICE_DIFF", "auto");
    w->diff_env = strcmp(diff, "on") == 0 ? 1 : strcmp(diff, "off") == 0 ? 0 : 2;
    w->legacy = strcmp(env_or("MAPPING_MODEL_LEGACY", "0"), "1") == 0;
    w->page_granular = w->legacy || strcmp(env_or("MAPPING_MODEL_PAGE_GRANULAR", "0"), "1") == 0;
    w->verbose = strcmp(env_or("MAPPING_MODEL_TRACE", "0"), "1") == 0;
    w->mechanism = mapping_write_tracking(NULL);
    w->ndev = 2;
    for (int d = 0; d < 2; d++) {
        mapping_device *given = d ? given1 : given0;
        if (given) {
            w->dev[d] = given;
            continue;
        }
        mapping_device_desc desc = {.backend = backend};
        if (d == 1 && strcmp(backend, "host") == 0) { /* copies take time: queued work is still running */
            desc.link_latency = 2e-6;
            desc.link_bandwidth = 2e10;
        }
        mapping_status st = mapping_open(&desc, &w->dev[d]);
        if (st != MAPPING_OK)
            return st == MAPPING_ERR_NO_BACKEND || st == MAPPING_ERR_NO_DEVICE ? 77 : 1;
        w->own_dev[d] = 1;
    }
    for (int d = 0; d < 2; d++) {
        /* Merging by the link model only below 20 bytes: the batch's gaps
         * (under 64) are the widest merge, so GAP bounds every copy. */
        mapping_link link = {2e-9, 1e10};
        if (mapping_device_set_link(w->dev[d], &link) != MAPPING_OK)
            return 1;
        for (int k = 0; k < NSTREAM; k++) {
            mstream *ms = stream_of(w, d, k);
            ms->dev = d;
            if (mapping_stream_create(w->dev[d], &ms->s) != MAPPING_OK)
                return 1;
        }
    }
    return 0;
}

#ifndef MIRROR_MATRIX_FUZZ
/* The race checker stops the process with abort(): the op trace first. */
static world *abort_world;

static void put(const char *text)
{
    size_t n = strlen(text);
    while (n) {
        ssize_t k = write(2, text, n);
        if (k <= 0)
            return;
        text += k;
        n -= (size_t)k;
    }
}

static void on_abort(int sig)
{
    world *w = abort_world;
    if (w) {
        char line[200];
        put("mirror model: SIGABRT; the ops of this sequence:\n");
        int first = w->ntrace > TRACE_LINES ? w->ntrace - TRACE_LINES : 0;
        for (int i = first; i < w->ntrace; i++) {
            put("  ");
            put(w->trace[i % TRACE_LINES]);
            put("\n");
        }
        snprintf(line, sizeof line, "mirror model: aborted at step %d of seed %u (replay: MAPPING_TEST_SEED=%u)\n",
                 w->step, w->seed, w->seed);
        put(line);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void world_close(world *w)
{
    for (int i = 0; i < w->ndev * NSTREAM; i++)
        mapping_stream_destroy(w->st[i].s);
    for (int d = 0; d < w->ndev; d++) {
        mapping_device_set_checks(w->dev[d], 0);
        if (w->own_dev[d])
            mapping_close(w->dev[d]);
    }
    free(w->scratch);
    free(w->src);
    free(w->mask);
    free(w->restore);
    free(w->save);
}
#endif

#ifdef MIRROR_MATRIX_FUZZ

/* ---- the fuzz entry points (tests/fuzz/fuzz_model.c) ---- */

static world FW;
static int   fw_open;

int  mirror_matrix_fuzz_setup(void);
int  mirror_matrix_fuzz_run(const uint8_t *data, size_t size);
void mirror_matrix_fuzz_totals(unsigned long long *steps, unsigned long long *bytes, unsigned long long *tracked);

int mirror_matrix_fuzz_setup(void)
{
    if (fw_open)
        return 0;
    int st = world_open(&FW, NULL, NULL);
    if (st == 77)
        printf("SKIP: back end %s is not available here\n", env_or("MAPPING_BACKEND", "host"));
    fw_open = st == 0;
    return st;
}

static unsigned long long fuzz_tracked_inputs;

/* The input: a cell byte, then one byte per choice; its steps run until
 * the input ends (at most 400). */
int mirror_matrix_fuzz_run(const uint8_t *data, size_t size)
{
    world *w = &FW;
    w->in = data;
    w->in_size = size;
    w->in_pos = 0;
    w->seed = 0;
    w->rng = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < size && i < 64; i++)
        w->rng = (w->rng ^ data[i]) * 0x100000001B3ull;
    if (!w->rng)
        w->rng = 1;
    cell_of_seed(w, (unsigned)pick(w, NCELLS));
    begin_sequence(w);
    fuzz_tracked_inputs += w->f[0].tracked;
    for (w->step = 1; w->step <= 400 && w->in_pos < w->in_size; w->step++) {
        step(w);
        check_memory(w);
        w->steps_total++;
    }
    model_self_check(w);
    end_sequence(w);
    w->in = NULL;
    return 0;
}

void mirror_matrix_fuzz_totals(unsigned long long *steps, unsigned long long *bytes, unsigned long long *tracked)
{
    *steps = FW.steps_total;
    *bytes = FW.bytes_checked;
    *tracked = fuzz_tracked_inputs;
}

#else

/* ---- the test ---- */

static bool sanitized(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer) ||      \
    __has_feature(undefined_behavior_sanitizer)
    return true;
#else
    return getenv("MAPPING_TEST_SANITIZED") != NULL;
#endif
#else
    return getenv("MAPPING_TEST_SANITIZED") != NULL;
#endif
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Cleans up after a failed sequence (MAPPING_MODEL_KEEP_GOING, reduction). */
static void recover(world *w)
{
    for (int i = 0; i < w->ndev * NSTREAM; i++) {
        (void)mapping_stream_synchronize(w->st[i].s);
        w->st[i].nf = 0;
    }
    for (int i = 0; i < w->nf; i++)
        fam_free(&w->f[i]);
    w->nf = 0;
    w->keep = NULL;
    budgets_off(w);
}

/* MAPPING_MODEL_KEEP_GOING=1: a failed sequence is counted, cleaned up. */
static void run_seed_going_on(world *w, unsigned seed)
{
    jmp_buf jb;
    if (setjmp(jb) == 0) {
        keep_going = &jb;
        run_seed(w, seed, SEQ_STEPS);
    } else {
        w->steps_total += (unsigned long long)(w->step > 0 ? w->step : 0);
        recover(w);
    }
    keep_going = NULL;
}

/* Runs seed with the steps in keep (1..steps); returns the step it failed
 * at (its message in last_failure), or 0. */
static int try_steps(world *w, unsigned seed, const unsigned char *keep, int steps)
{
    jmp_buf jb;
    volatile int failed = 0;
    counting = 0;
    if (setjmp(jb) == 0) {
        keep_going = &jb;
        w->keep = keep;
        run_seed(w, seed, steps);
    } else {
        failed = last_failure_step ? last_failure_step : -1;
        recover(w);
    }
    keep_going = NULL;
    w->keep = NULL;
    counting = 1;
    return failed;
}

/* The failure's kind: its message without numbers (as count_failure). */
static void kind_of(const char *msg, char *out, size_t cap)
{
    size_t k = 0;
    for (const char *p = msg; *p && k + 1 < cap; p++)
        if (!isdigit((unsigned char)*p))
            out[k++] = *p;
    out[k] = 0;
}

/* MAPPING_MODEL_REDUCE=1 with MAPPING_TEST_SEED=<n>: the fewest steps of
 * sequence n that still fail the same way (ddmin over the steps before
 * the failing one), printed with their trace. */
static void reduce(world *w, unsigned seed, int steps)
{
    static unsigned char keep[SEQ_STEPS + 2];
    int cand[SEQ_STEPS + 1], nc = 0;
    int at = try_steps(w, seed, NULL, steps);
    if (!at) {
        printf("reduce: seed %u does not fail\n", seed);
        return;
    }
    char want[400], got[400];
    kind_of(last_failure, want, sizeof want);
    printf("reduce: seed %u fails at step %d: %s\n", seed, at, last_failure);
    for (int i = 1; i < at && at > 0; i++)
        cand[nc++] = i;
    int n = 2, runs = 0;
    while (nc >= 1 && runs < 2000) {
        int chunk = (nc + n - 1) / n, reduced = 0;
        for (int c = 0; c < n && !reduced; c++) {
            int lo = c * chunk, hi = lo + chunk < nc ? lo + chunk : nc;
            if (lo >= hi)
                continue;
            memset(keep, 0, sizeof keep);
            for (int i = 0; i < nc; i++)
                if (i < lo || i >= hi)
                    keep[cand[i]] = 1;
            keep[at] = 1;
            runs++;
            int f = try_steps(w, seed, keep, at);
            kind_of(last_failure, got, sizeof got);
            if (f > 0 && strcmp(got, want) == 0) {
                int m = 0;
                for (int i = 0; i < nc; i++)
                    if ((i < lo || i >= hi) && cand[i] < f)
                        cand[m++] = cand[i];
                nc = m;
                at = f;
                n = n > 2 ? n - 1 : 2;
                reduced = 1;
            }
        }
        if (!reduced) {
            if (n >= nc)
                break;
            n = 2 * n < nc ? 2 * n : nc;
        }
    }
    memset(keep, 0, sizeof keep);
    for (int i = 0; i < nc; i++)
        keep[cand[i]] = 1;
    keep[at] = 1;
    printf("reduce: %d runs; the steps that still fail: ", runs);
    for (int i = 0; i < nc; i++)
        printf("%d,", cand[i]);
    printf("%d (MAPPING_MODEL_STEPS_ONLY=<them> replays them)\n", at);
    w->keep = keep;
    run_seed(w, seed, at); /* fails, printing the reduced trace */
}

TEST(mirror_matrix_model)
{
    static world W;
    world *w = &W;
    mapping_device *d0 = test_device(), *d1 = test_device2();
    const char *track = env_or("MAPPING_TRACK", "auto");
    if (strcmp(track, "auto") != 0 && strcmp(track, "none") != 0) {
        mapping_track_mechanism want = strcmp(track, "uffd") == 0 ? MAPPING_TRACK_UFFD : MAPPING_TRACK_MPROTECT;
        if (mapping_write_tracking(NULL) != want)
            test_skip("MAPPING_TRACK=%s is not available here: %s", track, mapping_write_tracking_description());
    }
    /* Device 1 of the world: on the host back end one with a modelled link
     * (queued copies still run when the next op comes); else the harness's
     * second object of the device. */
    int st = world_open(w, d0, strcmp(test_backend(), "host") == 0 ? NULL : d1);
    abort_world = w;
    signal(SIGABRT, on_abort);
    if (st == 77)
        test_skip("back end %s is not available here", test_backend());
    CHECK(st == 0);
    long total = strtol(env_or("MAPPING_MODEL_STEPS", "8000"), NULL, 10);
    if (sanitized())
        total /= 10;
    const char *only = getenv("MAPPING_TEST_SEED");
    double t0 = now_s(), cell_time[NCELLS] = {0};
    unsigned long long cell_steps[NCELLS] = {0};
    if (only) { /* one seed, or "first-last" (a sequence may depend on the library's state after earlier ones) */
        char *end = NULL;
        unsigned first = (unsigned)strtoul(only, &end, 10), last = first;
        if (end && *end == '-')
            last = (unsigned)strtoul(end + 1, NULL, 10);
        int steps = (int)strtol(env_or("MAPPING_MODEL_SEQ_STEPS", "200"), NULL, 10);
        static unsigned char only_steps[SEQ_STEPS + 2];
        const char *list = getenv("MAPPING_MODEL_STEPS_ONLY");
        for (const char *p = list; p && *p;) {
            long k = strtol(p, (char **)&p, 10);
            if (k > 0 && k <= SEQ_STEPS)
                only_steps[k] = 1;
            while (*p && !isdigit((unsigned char)*p))
                p++;
        }
        for (unsigned seed = first; seed <= last; seed++) {
            printf("seed %u: cell %u\n", seed, seed % NCELLS);
            if (seed == last && strcmp(env_or("MAPPING_MODEL_REDUCE", "0"), "1") == 0) {
                reduce(w, seed, steps);
                break;
            }
            w->keep = seed == last && list ? only_steps : NULL;
            run_seed(w, seed, seed == last ? steps : SEQ_STEPS);
            w->keep = NULL;
        }
    } else {
        unsigned seed = 1;
        bool going = strcmp(env_or("MAPPING_MODEL_KEEP_GOING", "0"), "1") == 0;
        while ((long)w->steps_total < total) {
            double c0 = now_s();
            unsigned long long s0 = w->steps_total;
            if (going)
                run_seed_going_on(w, seed);
            else
                run_seed(w, seed, SEQ_STEPS);
            cell_time[seed % NCELLS] += now_s() - c0;
            cell_steps[seed % NCELLS] += w->steps_total - s0;
            seed++;
        }
        printf("%u sequences\n", seed - 1);
        if (going) {
            unsigned failed = 0;
            for (int i = 0; i < nkinds; i++)
                failed += kinds[i].count;
            printf("MAPPING_MODEL_KEEP_GOING: %u sequences failed, %d kinds of failure:\n", failed, nkinds);
            for (int i = 0; i < nkinds; i++)
                printf("  %5u x  (earliest: seed %u step %d)  %s\n", kinds[i].count, kinds[i].seed, kinds[i].step,
                       kinds[i].key);
            CHECK(failed == 0);
        }
    }
    double t = now_s() - t0;
    printf("mirror model: %llu steps in %.1f s (%.0f steps/s), %llu bytes compared, %llu syncs (%llu queued), %llu "
           "conflicts refused, %llu tracked conflicts, %llu stale queries, %llu stats checks; back end %s, tracking "
           "%s, device diff env %s%s\n",
           w->steps_total, t, (double)w->steps_total / (t > 0 ? t : 1), w->bytes_checked, w->syncs, w->stream_ops,
           w->conflicts_seen, w->tracked_conflicts_seen, w->stale_queries, w->stats_checks, test_backend(),
           mapping_write_tracking_description(), env_or("MAPPING_DEVICE_DIFF", "auto"),
           sanitized() ? " (sanitizers: a tenth of the steps)" : "");
    printf("memory budgets: %llu sequences, %llu evictions, %llu device sides made again, %llu refusals for want of "
           "room\n",
           w->budget_seqs, w->evictions_seen, w->materialized_seen, w->oom_seen);
    if (!only)
        for (int c = 0; c < NCELLS; c++)
            printf("  cell %2d %-11s %-8s race %-3s: %6llu steps, %6.2f s\n", c, shape_names[c % 4],
                   c / 4 % 2 ? "streams" : "blocking", c / 8 % 2 ? "on" : "off", cell_steps[c], cell_time[c]);
    abort_world = NULL;
    world_close(w);
}

#endif
