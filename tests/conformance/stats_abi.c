/* ABI of mapping_stats: the struct grows while the soname stays .so.0, so
 * the library writes exactly the size the caller was compiled with. These
 * tests stand in for programs built against an older (shorter) and a newer
 * (longer) header, each struct followed by guard bytes that must survive. */
#include "harness.h"

enum { GUARD = 64, GUARD_BYTE = 0xA5 };

/* mapping_stats as an older header declared it: the first 13 counters
 * (before peer_bytes, peer_copies and blocking_ns), then guard bytes. */
typedef struct older_stats {
    uint64_t      h2d_bytes, h2d_copies, d2h_bytes, d2h_copies, d2d_bytes, d2d_copies, fill_bytes, fills,
        sync_skipped_bytes, conflicts, batch_flushes, batch_copies;
    unsigned char guard[GUARD];
} older_stats;

/* As a newer header might declare it: today's fields, 4 more counters. */
typedef struct newer_stats {
    mapping_stats now;
    uint64_t      later[4];
    unsigned char guard[GUARD];
} newer_stats;

static void check_guard(const unsigned char *guard)
{
    for (int i = 0; i < GUARD; i++)
        if (guard[i] != GUARD_BYTE)
            test_fail(__FILE__, __LINE__, "guard byte %d after the caller's struct was overwritten (0x%02x)", i,
                      guard[i]);
}

/* Some traffic, so that the counters are not all zero. */
static void move_some_bytes(mapping_device *dev)
{
    unsigned char host[4096] = {1};
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, sizeof host, &buf));
    CHECK_OK(mapping_sync_to_gpu(host, buf));
    CHECK_OK(mapping_sync_to_cpu(buf, host));
    CHECK_OK(mapping_fill_gpu(NULL, buf, 0, sizeof host, 7));
    mapping_free_gpu(buf);
}

TEST(stats_into_an_older_shorter_struct_stop_at_its_end)
{
    mapping_device *dev = test_device();
    move_some_bytes(dev);
    mapping_stats full = test_stats(dev);
    CHECK(full.h2d_bytes >= 4096 && full.fills >= 1);

    older_stats old;
    memset(&old, 0x11, offsetof(older_stats, guard));
    memset(old.guard, GUARD_BYTE, GUARD);
    size_t old_size = offsetof(older_stats, guard);
    CHECK_OK(mapping_device_stats_sized(dev, (mapping_stats *)(void *)&old, old_size));
    check_guard(old.guard);
    CHECK(old.h2d_bytes == full.h2d_bytes && old.h2d_copies == full.h2d_copies);
    CHECK(old.d2h_bytes == full.d2h_bytes && old.fill_bytes == full.fill_bytes && old.fills == full.fills);
    CHECK(old.batch_copies == full.batch_copies);
}

TEST(stats_into_a_newer_longer_struct_zero_the_fields_this_library_does_not_know)
{
    mapping_device *dev = test_device();
    move_some_bytes(dev);
    newer_stats n;
    memset(&n, 0x11, offsetof(newer_stats, guard));
    memset(n.guard, GUARD_BYTE, GUARD);
    CHECK_OK(mapping_device_stats_sized(dev, &n.now, offsetof(newer_stats, guard)));
    check_guard(n.guard);
    mapping_stats full = test_stats(dev);
    CHECK(memcmp(&n.now, &full, sizeof full) == 0); /* idle device: the same snapshot */
    for (int i = 0; i < 4; i++)
        CHECK(n.later[i] == 0);
}

TEST(stats_exported_function_writes_only_the_first_layout)
{
    /* A program built before the sizing macro calls the exported function
     * with a 0.1.0 struct: 15 counters, 120 bytes. */
    mapping_device *dev = test_device();
    move_some_bytes(dev);
    struct {
        uint64_t      fields[15];
        unsigned char guard[GUARD];
    } v010;
    memset(v010.guard, GUARD_BYTE, GUARD);
    CHECK_OK((mapping_device_stats)(dev, (mapping_stats *)(void *)&v010));
    check_guard(v010.guard);
    mapping_stats full = test_stats(dev);
    CHECK(v010.fields[0] == full.h2d_bytes);
    CHECK(v010.fields[14] == full.blocking_ns);
    /* The macro is what a program compiled now calls: the whole struct. */
    mapping_stats s;
    memset(&s, 0x11, sizeof s);
    CHECK_OK(mapping_device_stats(dev, &s));
    CHECK(memcmp(&s, &full, sizeof s) == 0);
}

TEST(stats_sized_refuses_a_size_that_is_no_struct)
{
    mapping_device *dev = test_device();
    mapping_stats s;
    CHECK_REFUSED(mapping_device_stats_sized(dev, &s, 0), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_device_stats_sized(dev, &s, 12), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), "out_size 12") != NULL);
    CHECK_REFUSED(mapping_device_stats_sized(dev, NULL, sizeof s), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_device_stats_sized(NULL, &s, sizeof s), MAPPING_ERR_NULL_ARGUMENT);
}
