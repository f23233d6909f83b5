/*
 * The device memory budget (core.h, "the memory budget"): counted bytes,
 * and the eviction of registered owners, least recently used first, when a
 * counted allocation would exceed it. The policy lives here (which owner
 * goes first); what an eviction does is the owner's evict hook (a mirror's:
 * coherence/mirror_resident.c). One eviction at a time per device
 * (reclaim_lock); the hook runs on the thread that needs the memory and
 * must not itself reclaim (a counted allocation it makes fails instead).
 */
#include <inttypes.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include "core/core.h"

static _Thread_local bool reclaiming;

const void *mapping__reclaim_thread_token(void)
{
    static _Thread_local char token;
    return &token;
}

bool mapping__budget_reclaiming(void)
{
    return reclaiming;
}

void mapping__reclaimable_add(mapping_device *dev, mapping_reclaimable *r)
{
    pthread_mutex_lock(&dev->reclaim_lock);
    r->node.next = dev->reclaimables.next;
    r->node.prev = &dev->reclaimables;
    dev->reclaimables.next->prev = &r->node;
    dev->reclaimables.next = &r->node;
    pthread_mutex_unlock(&dev->reclaim_lock);
}

void mapping__reclaimable_remove(mapping_device *dev, mapping_reclaimable *r)
{
    pthread_mutex_lock(&dev->reclaim_lock);
    r->node.prev->next = r->node.next;
    r->node.next->prev = r->node.prev;
    r->node.prev = r->node.next = &r->node;
    pthread_mutex_unlock(&dev->reclaim_lock);
}

/* Does a go before b? EVICT_FIRST before DEFAULT, then the older use. */
static bool goes_before(const mapping_reclaimable *a, const mapping_reclaimable *b)
{
    int ha = atomic_load_explicit(&a->hint, memory_order_relaxed) == MAPPING_RESIDENCY_EVICT_FIRST;
    int hb = atomic_load_explicit(&b->hint, memory_order_relaxed) == MAPPING_RESIDENCY_EVICT_FIRST;
    if (ha != hb)
        return ha;
    return atomic_load_explicit(&a->stamp, memory_order_relaxed) < atomic_load_explicit(&b->stamp, memory_order_relaxed);
}

/* The next owner to try in this round: resident, not KEEP, not tried yet. */
static mapping_reclaimable *next_victim(mapping_device *dev, uint64_t round)
{
    mapping_reclaimable *best = NULL;
    for (mapping_list_node *n = dev->reclaimables.next; n != &dev->reclaimables; n = n->next) {
        mapping_reclaimable *r = (mapping_reclaimable *)((char *)n - offsetof(mapping_reclaimable, node));
        if (r->tried == round || !atomic_load_explicit(&r->bytes, memory_order_relaxed) ||
            atomic_load_explicit(&r->hint, memory_order_relaxed) == MAPPING_RESIDENCY_KEEP)
            continue;
        if (!best || goes_before(r, best))
            best = r;
    }
    return best;
}

/* Evicts one owner, the first that can go: DONE; else IN_USE when one
 * could not only because a call on another thread held it, REFUSED when
 * none could. */
static mapping_evict_result reclaim_one(mapping_device *dev)
{
    static _Atomic uint64_t rounds;
    uint64_t round = atomic_fetch_add_explicit(&rounds, 1, memory_order_relaxed) + 1;
    mapping_evict_result result = MAPPING_EVICT_REFUSED;
    pthread_mutex_lock(&dev->reclaim_lock);
    reclaiming = true;
    for (mapping_reclaimable *r; result != MAPPING_EVICT_DONE && (r = next_victim(dev, round));) {
        r->tried = round;
        mapping_evict_result got = r->evict(r);
        if (got != MAPPING_EVICT_REFUSED)
            result = got;
    }
    reclaiming = false;
    pthread_mutex_unlock(&dev->reclaim_lock);
    return result;
}

/* An owner in a call on another thread is idle again when that call
 * returns: an allocation that found nothing else to evict waits for it,
 * trying again with the CPU yielded in between (then 50 us sleeps), up to
 * IN_USE_WAIT_NS, before it gives up. Bounded: two threads whose calls
 * each need the other's family evicted both fail, as they did at once
 * before, rather than wait for each other for good. Owners that will not
 * go (acquired, queued work, KEEP, the allocation's own family) end the
 * wait at once. */
enum { IN_USE_SPINS = 64 };
#define IN_USE_WAIT_NS 100000000ull /* 100 ms */

static void in_use_pause(int tries)
{
    if (tries < IN_USE_SPINS) {
        sched_yield();
        return;
    }
    struct timespec pause = {0, 50000};
    nanosleep(&pause, NULL);
}

/* One eviction for an allocation that does not fit: false when none could
 * be made, after waiting a little for owners in use on other threads. */
static bool reclaim_for_allocation(mapping_device *dev, uint64_t budget, size_t bytes)
{
    uint64_t start = 0;
    for (int tries = 0;; tries++) {
        mapping_evict_result got = reclaim_one(dev);
        if (got == MAPPING_EVICT_DONE)
            return true;
        if (got == MAPPING_EVICT_REFUSED)
            return false;
        uint64_t now_ns = mapping_os_now_ns();
        if (!start)
            start = now_ns;
        else if (now_ns - start > IN_USE_WAIT_NS)
            return false;
        in_use_pause(tries);
        if (atomic_load(&dev->resident) <= budget - bytes) /* another thread's eviction or free made room */
            return true;
    }
}

size_t mapping__budget_reclaim(mapping_device *dev, uint64_t target)
{
    size_t n = 0;
    while (atomic_load(&dev->resident) > target && !reclaiming && reclaim_one(dev) == MAPPING_EVICT_DONE)
        n++;
    return n;
}

static void peak_update(mapping_device *dev, uint64_t now)
{
    _Atomic uint64_t *peak = &dev->counters.peak_resident_bytes;
    uint64_t seen = atomic_load_explicit(peak, memory_order_relaxed);
    while (now > seen && !atomic_compare_exchange_weak_explicit(peak, &seen, now, memory_order_relaxed,
                                                                memory_order_relaxed))
        ;
}

static mapping_status over_budget(const char *fn, mapping_device *dev, size_t bytes, uint64_t budget)
{
    uint64_t resident = atomic_load(&dev->resident), plain = atomic_load(&dev->resident_plain);
    if (bytes > budget)
        return mapping__fail(MAPPING_ERR_OUT_OF_DEVICE_MEMORY,
                             "%s: %zu bytes are more than the whole memory budget of device %s (%" PRIu64
                             " bytes; raise it with mapping_device_set_memory_budget); nothing was changed",
                             fn, bytes, dev->info.name, budget);
    return mapping__fail(MAPPING_ERR_OUT_OF_DEVICE_MEMORY,
                         "%s: %zu bytes more would exceed the memory budget of device %s (%" PRIu64 " bytes): %" PRIu64
                         " bytes are resident, %" PRIu64 " of them in buffers from mapping_allocate_gpu (never "
                         "evicted) and %" PRIu64 " in mirrors that could not be evicted now (acquired and not "
                         "released, work queued, in a call on another thread for over 100 ms, "
                         "MAPPING_RESIDENCY_KEEP, or an eviction was under way); free buffers, release or destroy "
                         "mirrors, or raise the budget "
                         "(mapping_device_set_memory_budget); nothing was changed",
                         fn, bytes, dev->info.name, budget, resident, plain, resident - plain);
}

mapping_status mapping__budget_reserve(const char *fn, mapping_device *dev, size_t bytes, bool plain)
{
    for (;;) {
        uint64_t budget = atomic_load(&dev->budget), now = atomic_load(&dev->resident);
        if (!budget || (bytes <= budget && now <= budget - bytes)) {
            if (!atomic_compare_exchange_weak(&dev->resident, &now, now + bytes))
                continue;
            if (plain)
                atomic_fetch_add(&dev->resident_plain, bytes);
            peak_update(dev, now + bytes);
            return MAPPING_OK;
        }
        if (bytes > budget || reclaiming || !reclaim_for_allocation(dev, budget, bytes))
            return over_budget(fn, dev, bytes, budget);
    }
}

void mapping__budget_release(mapping_device *dev, size_t bytes, bool plain)
{
    atomic_fetch_sub(&dev->resident, bytes);
    if (plain)
        atomic_fetch_sub(&dev->resident_plain, bytes);
}

/* 2^60: above any device's memory, and no overflow in sums. */
#define BUDGET_MAX ((uint64_t)1 << 60)

mapping_status mapping_device_set_memory_budget(mapping_device *dev, uint64_t bytes)
{
    static const char fn[] = "mapping_device_set_memory_budget";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)))
        return st;
    if (bytes > BUDGET_MAX)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: %" PRIu64 " bytes is more than 2^60", fn, bytes);
    if (atomic_exchange(&dev->budget, bytes) == 0 && bytes)
        /* Mirrors made without a budget join it at their next call: their
         * next handle check misses its memo and takes the slow way
         * (coherence/mirror_call.c), as after a handle's removal. */
        atomic_fetch_add_explicit(&mapping__handle_epoch, 1, memory_order_release);
    if (bytes)
        mapping__budget_reclaim(dev, bytes);
    return MAPPING_OK;
}

mapping_status mapping_device_memory_budget(const mapping_device *dev, uint64_t *budget, uint64_t *resident)
{
    mapping_status st = mapping__check_device("mapping_device_memory_budget", dev);
    if (st)
        return st;
    if (budget)
        *budget = atomic_load(&((mapping_device *)dev)->budget);
    if (resident)
        *resident = atomic_load(&((mapping_device *)dev)->resident);
    return MAPPING_OK;
}

bool mapping__budget_from_env(uint64_t *out)
{
    const char *v = getenv("MAPPING_MEMORY_BUDGET");
    uint64_t n = 0;
    *out = 0;
    if (!v || !*v)
        return true;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9' || n > BUDGET_MAX)
            return false;
        n = n * 10 + (uint64_t)(*c - '0');
    }
    if (n > BUDGET_MAX)
        return false;
    *out = n;
    return true;
}
