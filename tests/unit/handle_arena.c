/* os/handle_arena.c: memory for handle objects, at addresses never used
 * twice, zeroed and 64-byte aligned, failing where an allocation fault is
 * injected. */
#include <stdint.h>
#include "harness.h"
#include "os/os.h"

static int compare_pointers(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return (x > y) - (x < y);
}

UNIT_TEST(handle_arena_never_gives_an_address_twice)
{
    enum { TOTAL = 200000, LIVE = 300 };
    uintptr_t *seen = malloc(TOTAL * sizeof *seen);
    void *live[LIVE] = {0};
    CHECK(seen);
    unsigned long long rng = 12345;
    for (int i = 0; i < TOTAL; i++) {
        size_t bytes = 1 + (size_t)(test_xorshift64(&rng) % 1500);
        unsigned char *p = mapping_os_handle_alloc(bytes);
        CHECK(p);
        CHECK((uintptr_t)p % 64 == 0);
        for (size_t k = 0; k < bytes; k++)
            CHECK(p[k] == 0);
        memset(p, 0xEE, bytes); /* the next object must not see this */
        seen[i] = (uintptr_t)p;
        int slot = (int)(test_xorshift64(&rng) % LIVE); /* frees in random order, some objects live long */
        mapping_os_handle_free(live[slot]);
        live[slot] = p;
    }
    for (int i = 0; i < LIVE; i++)
        mapping_os_handle_free(live[i]);
    qsort(seen, TOTAL, sizeof *seen, compare_pointers);
    for (int i = 1; i < TOTAL; i++)
        if (seen[i] == seen[i - 1])
            test_fail(__FILE__, __LINE__, "address %#lx was given twice", (unsigned long)seen[i]);
    free(seen);
}

UNIT_TEST(handle_arena_fails_where_an_allocation_fault_is_injected_and_refuses_huge_objects)
{
    mapping_os_inject_alloc_fault(0);
    CHECK(mapping_os_handle_alloc(64) == NULL);
    void *p = mapping_os_handle_alloc(64);
    CHECK(p != NULL);
    mapping_os_handle_free(p);
    mapping_os_handle_free(NULL);
    CHECK(mapping_os_handle_alloc(0) == NULL);
    CHECK(mapping_os_handle_alloc((size_t)1 << 20) == NULL);
}
