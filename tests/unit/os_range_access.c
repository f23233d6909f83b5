/* mapping_os_range_access (os/maps.c) against mappings made here with known
 * protections: whole, partial, across neighbouring mappings, holes, the
 * executable report, and with enough mappings before the range that the
 * list spans many reads of /proc/self/maps. */
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>
#include "harness.h"
#include "os/os.h"

static unsigned char *map(size_t bytes, int prot)
{
    unsigned char *p = mmap(NULL, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    return p;
}

UNIT_TEST(range_access_reads_each_mappings_protection)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    /* Four pages: rw, r, none, rw (mprotect splits the mapping). */
    unsigned char *p = map(4 * page, PROT_READ | PROT_WRITE);
    CHECK(mprotect(p + page, page, PROT_READ) == 0 && mprotect(p + 2 * page, page, PROT_NONE) == 0);
    uintptr_t a = (uintptr_t)p;
    int exec = 7;
    CHECK(mapping_os_range_access(a, a + page, PROT_READ | PROT_WRITE, &exec) == 0 && exec == 0);
    CHECK(mapping_os_range_access(a + 10, a + page - 10, PROT_WRITE, NULL) == 0);     /* inside one page */
    CHECK(mapping_os_range_access(a, a + 2 * page, PROT_READ, NULL) == 0);            /* rw then r: readable */
    CHECK(mapping_os_range_access(a, a + 2 * page, PROT_WRITE, NULL) == -EACCES);     /* not writable */
    CHECK(mapping_os_range_access(a + page - 1, a + page + 1, PROT_WRITE, NULL) == -EACCES);
    CHECK(mapping_os_range_access(a + page, a + 3 * page, PROT_READ, NULL) == -EACCES); /* PROT_NONE */
    CHECK(mapping_os_range_access(a + 3 * page, a + 4 * page, PROT_WRITE, NULL) == 0);
    CHECK(mapping_os_range_access(a, a, PROT_WRITE, NULL) == 0); /* empty */
    CHECK(munmap(p + 3 * page, page) == 0);
    CHECK(mapping_os_range_access(a + 3 * page, a + 4 * page, PROT_READ, NULL) == -EFAULT); /* unmapped */
    CHECK(mapping_os_range_access(a + 2 * page, a + 4 * page, 0, NULL) == -EFAULT); /* ends in a hole */
    CHECK(munmap(p, 3 * page) == 0);
}

UNIT_TEST(range_access_finds_a_hole_between_two_mappings_and_reports_exec)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *p = map(3 * page, PROT_READ | PROT_WRITE);
    CHECK(munmap(p + page, page) == 0);
    uintptr_t a = (uintptr_t)p;
    CHECK(mapping_os_range_access(a, a + 3 * page, PROT_READ, NULL) == -EFAULT);
    CHECK(mapping_os_range_access(a + 2 * page, a + 3 * page, PROT_READ | PROT_WRITE, NULL) == 0);
    int exec = 0;
    CHECK(mprotect(p, page, PROT_READ | PROT_EXEC) == 0);
    CHECK(mapping_os_range_access(a, a + page, PROT_READ, &exec) == 0 && exec == PROT_EXEC);
    CHECK(mapping_os_range_access(a, a + page, PROT_WRITE, NULL) == -EACCES);
    unsigned char *q = map(2 * page, PROT_READ | PROT_WRITE);
    CHECK(mprotect(q, page, PROT_READ | PROT_WRITE | PROT_EXEC) == 0);
    CHECK(mapping_os_range_access((uintptr_t)q, (uintptr_t)q + 2 * page, PROT_WRITE, &exec) == 0 && exec == -1);
    munmap(p, page);
    munmap(p + 2 * page, page);
    munmap(q, 2 * page);
}

UNIT_TEST(range_access_reads_past_thousands_of_mappings)
{
    /* Alternating protections keep the kernel from merging them: ~3,000
     * lines, the list read in many chunks, lines split between them. */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    enum { N = 3000 };
    unsigned char *p = map(N * page, PROT_READ | PROT_WRITE);
    for (size_t i = 0; i < N; i += 2)
        CHECK(mprotect(p + i * page, page, PROT_READ) == 0);
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < N; i += 97) {
        int want = i % 2 ? 0 : -EACCES;
        CHECK(mapping_os_range_access(a + i * page, a + (i + 1) * page, PROT_WRITE, NULL) == want);
        CHECK(mapping_os_range_access(a + i * page, a + (i + 1) * page, PROT_READ, NULL) == 0);
    }
    CHECK(mapping_os_range_access(a, a + N * page, PROT_READ, NULL) == 0);
    CHECK(mapping_os_range_access(a + page, a + 2 * page + 1, PROT_WRITE, NULL) == -EACCES);
    munmap(p, N * page);
}
