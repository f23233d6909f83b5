/*
 * Accessors for tests (testing/test_hooks.h). They read the coherence layer's
 * state for tests only; nothing in the library calls them.
 */
#include "testing/test_hooks.h"
#include "coherence/mirror_features.h"
#include "coherence/mirror_mark_log.h"
#include "track/fault_count.h"
#include "track/fault_log.h"
#include "os/os.h"

static int side_index(mapping_side side)
{
    return side == MAPPING_GPU ? MIRROR_GPU : MIRROR_CPU;
}

const mapping_range_set *mapping__test_mirror_stale(const mapping_mirror *m, mapping_side side)
{
    mapping__mirror_log_flush(m->st); /* the sets as marking one by one would have left them */
    return &m->st->stale[side_index(side)];
}

const mapping_range_set *mapping__test_mirror_modified(const mapping_mirror *m, mapping_side side)
{
    mapping__mirror_log_flush(m->st); /* the sets as marking one by one would have left them */
    return &m->st->modified[side_index(side)];
}

const mapping_range_set *mapping__test_mirror_pending(const mapping_mirror *m, mapping_side side)
{
    mapping__mirror_log_flush(m->st); /* the sets as marking one by one would have left them */
    return &m->st->pending[side_index(side)];
}

size_t mapping__test_mirror_inflight(const mapping_mirror *m)
{
    return m->st->queue.n;
}

size_t mapping__test_mirror_logged(const mapping_mirror *m)
{
    return m->st->log.n;
}

void mapping__test_device_diff_mode(int mode)
{
    mapping__mirror_diff_force_mode(mode);
}

size_t mapping__test_mirror_diff_known(const mapping_mirror *m)
{
    return mapping__mirror_diff_known_bytes(m->st);
}

bool mapping__test_device_can_diff(const mapping_device *dev)
{
    return mapping__can_diff(dev);
}

bool mapping__test_fault_log(const char **why)
{
    return mapping_track_fault_log_available(why);
}

bool mapping__test_fault_entries(void)
{
    return mapping_track_fault_entries_available();
}

bool mapping__test_fault_entries_count(uint64_t *out)
{
    return mapping_track_fault_entries(out);
}

int mapping__test_copy_threads(void)
{
    return mapping_os_copy_threads();
}
