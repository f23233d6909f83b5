/*
 * uffd write tracking against a hostile program: what it does to a tracked
 * wrapped array's memory behind the mirror's back (munmap and mmap again,
 * madvise, mprotect, mlock, fork, MADV_COLLAPSE, shared memory, kernel
 * writes by pread / recvmsg / O_DIRECT, many mirrors under a small
 * RLIMIT_NOFILE). Every write into the tracked mapping must reach the
 * device at the next sync, or the sync must fail with a clear status.
 * uffd only (docs/mirrors.md, "Write tracking"); elsewhere they skip.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/userfaultfd.h>
#include "harness.h"

static size_t page(void)
{
    size_t g = 0;
    mapping_write_tracking(&g);
    return g;
}

static void need_uffd(void)
{
    if (mapping_write_tracking(NULL) != MAPPING_TRACK_UFFD)
        test_skip("uffd tracking only; this process tracks with: %s", mapping_write_tracking_description());
}

/* n bytes of fresh private anonymous memory. */
static unsigned char *anon(size_t n)
{
    unsigned char *a = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(a != MAP_FAILED);
    return a;
}

/* [a, +n) wrapped tracked and synced once (nothing stale). */
static mapping_mirror *tracked_wrap(mapping_device *dev, void *a, size_t n)
{
    mapping_mirror *m = NULL;
    CHECK_OK(mapping_mirror_wrap(dev, a, n, MAPPING_MIRROR_TRACK_WRITES, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    return m;
}

/* The device's byte at offset off of m. */
static unsigned char device_byte(mapping_mirror *m, size_t off)
{
    unsigned char b = 0;
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m) + off, &b, 1));
    return b;
}

/* A sync to the device carries the byte written at off. */
static void check_carried(mapping_mirror *m, size_t off, unsigned char want)
{
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(device_byte(m, off) == want);
}

/* munmap and a new mapping at the same address (free then malloc of a large
 * block, MAP_FIXED): the new memory is not registered with the userfaultfd,
 * so its writes cannot be found. Every sync says so with
 * MAPPING_ERR_INVALID_ARGUMENT and a message naming the cause (it used to
 * be MAPPING_ERR_OUT_OF_HOST_MEMORY, "could not list the written pages
 * (Operation not permitted)"); the mirror can still be destroyed. */
TEST(tracked_uffd_array_unmapped_and_mapped_again_fails_every_sync_with_a_clear_status)
{
    need_uffd();
    mapping_device *dev = test_device();
    size_t n = 16 * page();
    unsigned char *a = anon(n);
    mapping_mirror *m = tracked_wrap(dev, a, n);
    CHECK(munmap(a, n) == 0);
    CHECK(mmap(a, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == a);
    a[3 * page()] = 0x41;
    for (int i = 0; i < 2; i++) {
        CHECK_STATUS(mapping_mirror_sync_to_gpu(NULL, m), MAPPING_ERR_INVALID_ARGUMENT);
        CHECK(strstr(mapping_last_error_message(), "munmap") != NULL);
    }
    mapping_mirror_destroy(m);
    CHECK(munmap(a, n) == 0);
}

/* munmap, or an mremap that moves the array, and nothing mapped there:
 * a sync (to the CPU it would write into the hole, to the device read
 * from it) fails with MAPPING_ERR_INVALID_ARGUMENT instead of crashing
 * (it used to die by SIGSEGV in the copy). */
TEST(tracked_uffd_array_unmapped_or_moved_fails_syncs_instead_of_crashing)
{
    need_uffd();
    mapping_device *dev = test_device();
    size_t p = page(), n = 16 * p;
    for (int moved = 0; moved < 2; moved++) {
        unsigned char *a = anon(2 * n);
        CHECK(munmap(a + n, n) == 0);
        mapping_mirror *m = tracked_wrap(dev, a, n);
        CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, p));
        if (moved) {
            unsigned char *far = mmap(NULL, 4 * n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            CHECK(far != MAP_FAILED);
            a = mremap(a, n, 2 * n, MREMAP_MAYMOVE | MREMAP_FIXED, far);
            CHECK(a == far);
            a[2 * p] = 0x52;
        } else {
            CHECK(munmap(a, n) == 0);
        }
        CHECK_STATUS(mapping_mirror_sync_to_cpu(NULL, m), MAPPING_ERR_INVALID_ARGUMENT);
        CHECK(strstr(mapping_last_error_message(), "munmap") != NULL);
        /* Every call looks for the CPU's writes first: a mark fails the same way. */
        CHECK_STATUS(mapping_mirror_mark_cpu_modified(m, p, p), MAPPING_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(mapping_mirror_sync_to_gpu(NULL, m), MAPPING_ERR_INVALID_ARGUMENT);
        mapping_mirror_destroy(m);
        if (moved)
            CHECK(munmap(a, 4 * n) == 0);
    }
}

/* madvise(MADV_DONTNEED / MADV_FREE) then writes, mprotect read-only and
 * back, mlock: later writes are all carried (the zeroes DONTNEED leaves are
 * not: documented). */
TEST(tracked_uffd_writes_after_madvise_mprotect_and_mlock_are_carried)
{
    need_uffd();
    mapping_device *dev = test_device();
    size_t p = page(), n = 16 * p;
    unsigned char *a = anon(n);
    memset(a, 7, n);
    mapping_mirror *m = tracked_wrap(dev, a, n);
    a[3 * p] = 0x61; /* written, then dropped, then written again */
    CHECK(madvise(a + 3 * p, p, MADV_DONTNEED) == 0);
    a[3 * p + 1] = 0x62;
    check_carried(m, 3 * p + 1, 0x62);
    CHECK(madvise(a + 4 * p, p, MADV_DONTNEED) == 0); /* a protected page dropped */
    a[4 * p + 1] = 0x63;
    check_carried(m, 4 * p + 1, 0x63);
    CHECK(madvise(a + 5 * p, p, MADV_FREE) == 0);
    a[5 * p + 1] = 0x64;
    check_carried(m, 5 * p + 1, 0x64);
    CHECK(mprotect(a, n, PROT_READ) == 0 && mprotect(a, n, PROT_READ | PROT_WRITE) == 0);
    a[6 * p] = 0x65;
    check_carried(m, 6 * p, 0x65);
    a[7 * p] = 0x66; /* written, then protected and opened again before the sync */
    CHECK(mprotect(a + 7 * p, p, PROT_READ) == 0 && mprotect(a + 7 * p, p, PROT_READ | PROT_WRITE) == 0);
    check_carried(m, 7 * p, 0x66);
    if (mlock(a, n) == 0) {
        a[8 * p] = 0x67;
        check_carried(m, 8 * p, 0x67);
        munlock(a, n);
    }
    mapping_mirror_destroy(m);
    CHECK(munmap(a, n) == 0);
}

/* A memfd mapped MAP_SHARED: writes through the tracked mapping are carried,
 * also when the page was dropped from the mapping (MADV_DONTNEED keeps a
 * shared page's content) before the sync. */
TEST(tracked_uffd_memfd_shared_mapping_writes_are_carried)
{
    need_uffd();
    mapping_device *dev = test_device();
    size_t p = page(), n = 16 * p;
    int fd = memfd_create("mapping-test", MFD_CLOEXEC);
    if (fd < 0)
        test_skip("memfd_create: %s", strerror(errno));
    CHECK(ftruncate(fd, (off_t)n) == 0);
    unsigned char *a = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(a != MAP_FAILED);
    mapping_mirror *m = tracked_wrap(dev, a, n);
    a[2 * p] = 0x10;
    check_carried(m, 2 * p, 0x10);
    a[3 * p] = 0x11;
    CHECK(madvise(a + 3 * p, p, MADV_DONTNEED) == 0);
    check_carried(m, 3 * p, 0x11);
    mapping_mirror_destroy(m);
    CHECK(munmap(a, n) == 0);
    close(fd);
}

/* The kernel writing the array: pread, recvmsg, and O_DIRECT (where the
 * file system takes it). */
TEST(tracked_uffd_kernel_writes_by_pread_recvmsg_and_o_direct_are_carried)
{
    need_uffd();
    mapping_device *dev = test_device();
    size_t p = page(), n = 16 * p;
    unsigned char *a = anon(n);
    mapping_mirror *m = tracked_wrap(dev, a, n);
    char path[] = "mapping-uffd-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unsigned char *buf = anon(2 * p);
    memset(buf, 0x71, 2 * p);
    CHECK(pwrite(fd, buf, 2 * p, 0) == (ssize_t)(2 * p) && fsync(fd) == 0);
    CHECK(pread(fd, a + 5 * p + 3, 100, 0) == 100);
    check_carried(m, 5 * p + 3, 0x71);
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) == 0);
    CHECK(write(sv[1], buf, 50) == 50);
    struct iovec iov = {a + 7 * p + 1, 50};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    CHECK(recvmsg(sv[0], &mh, 0) == 50);
    check_carried(m, 7 * p + 1, 0x71);
    int dfd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (dfd >= 0 && pread(dfd, a + 9 * p, p, 0) == (ssize_t)p) /* tmpfs and others refuse O_DIRECT */
        check_carried(m, 9 * p + p - 1, 0x71);
    if (dfd >= 0)
        close(dfd);
    unlink(path);
    close(fd);
    close(sv[0]);
    close(sv[1]);
    mapping_mirror_destroy(m);
    CHECK(munmap(buf, 2 * p) == 0 && munmap(a, n) == 0);
}

/* fork shares the pages copy-on-write: the parent's writes before, while
 * and after a child lives are carried; the child's do not touch them. */
TEST(tracked_uffd_parent_writes_around_a_copy_on_write_fork_are_carried)
{
    need_uffd();
    mapping_device *dev = test_device();
    size_t p = page(), n = 16 * p;
    unsigned char *a = anon(n);
    memset(a, 1, n);
    mapping_mirror *m = tracked_wrap(dev, a, n);
    a[2 * p] = 0x81;
    pid_t c = fork();
    CHECK(c >= 0);
    if (c == 0) {
        a[3 * p] = 0x99;
        _exit(0);
    }
    a[4 * p] = 0x83; /* while the child may still live */
    int status;
    CHECK(waitpid(c, &status, 0) == c && WIFEXITED(status));
    a[3 * p + 1] = 0x82;
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(device_byte(m, 2 * p) == 0x81 && device_byte(m, 4 * p) == 0x83 && device_byte(m, 3 * p + 1) == 0x82 &&
          device_byte(m, 3 * p) == 1);
    mapping_mirror_destroy(m);
    CHECK(munmap(a, n) == 0);
}

/* MADV_COLLAPSE of a tracked huge-page range: refused by the kernel or
 * done; either way the writes before and after are carried. */
TEST(tracked_uffd_writes_around_madv_collapse_are_carried)
{
    need_uffd();
    mapping_device *dev = test_device();
    size_t p = page(), huge = (size_t)2 << 20;
    unsigned char *r = anon(2 * huge);
    unsigned char *a = (unsigned char *)(((uintptr_t)r + huge - 1) & ~(uintptr_t)(huge - 1));
    (void)madvise(a, huge, MADV_HUGEPAGE);
    memset(a, 1, huge);
    mapping_mirror *m = tracked_wrap(dev, a, huge);
    a[5 * p] = 0x91;
    (void)madvise(a, huge, 25 /* MADV_COLLAPSE, Linux 6.1 */);
    check_carried(m, 5 * p, 0x91);
    for (size_t i = 0; i < huge; i += p)
        a[i] = 2;
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    (void)madvise(a, huge, 25);
    a[7 * p + 1] = 0x92;
    check_carried(m, 7 * p + 1, 0x92);
    mapping_mirror_destroy(m);
    CHECK(munmap(r, 2 * huge) == 0);
}

/* One userfaultfd serves the process: many more tracked mirrors than
 * descriptors allowed, each carrying its write. The limit leaves 64
 * descriptors above those already open (a GPU driver holds dozens: a fixed
 * limit of 64 left it none for its next allocation), and the device still
 * allocates under it. */
TEST(tracked_uffd_mirrors_beyond_rlimit_nofile_carry_their_writes)
{
    need_uffd();
    mapping_device *dev = test_device();
    enum { N = 600 };
    size_t p = page();
    struct rlimit old, small;
    CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0);
    small = old;
    small.rlim_cur = 64;
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) != -1 && (rlim_t)fd + 65 > small.rlim_cur)
            small.rlim_cur = (rlim_t)fd + 65;
    if (small.rlim_cur >= N)
        test_skip("%d descriptors are open: a limit of 64 more is not below %d mirrors", (int)small.rlim_cur - 64, N);
    CHECK(setrlimit(RLIMIT_NOFILE, &small) == 0);
    mapping_buffer *big; /* beyond the pools a GPU back end makes at open: the driver allocates */
    CHECK_OK(mapping_allocate_gpu(dev, 4u << 20, &big));
    mapping_free_gpu(big);
    unsigned char *a = anon(N * p);
    static mapping_mirror *ms[N];
    for (int i = 0; i < N; i++)
        ms[i] = tracked_wrap(dev, a + (size_t)i * p, p);
    for (int i = 0; i < N; i++)
        a[(size_t)i * p + 1] = (unsigned char)(i | 1);
    for (int i = 0; i < N; i++)
        check_carried(ms[i], 1, (unsigned char)(i | 1));
    for (int i = 0; i < N; i++)
        mapping_mirror_destroy(ms[i]);
    CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
    CHECK(munmap(a, N * p) == 0);
}

/* Two mirrors on one page, whatever their bytes: the second is refused. */
TEST(tracked_uffd_second_mirror_sharing_a_page_is_refused)
{
    need_uffd();
    mapping_device *dev = test_device();
    size_t p = page();
    unsigned char *a = anon(4 * p);
    mapping_mirror *m1 = tracked_wrap(dev, a, p + 100), *m2 = NULL;
    CHECK_STATUS(mapping_mirror_wrap(dev, a + p + 200, 300, MAPPING_MIRROR_TRACK_WRITES, &m2),
                 MAPPING_ERR_UNSUPPORTED);
    CHECK(m2 == NULL);
    mapping_mirror_destroy(m1);
    CHECK(munmap(a, 4 * p) == 0);
}

/* The program registered the array with a userfaultfd of its own (a page
 * takes one): the wrap is refused with MAPPING_ERR_UNSUPPORTED and a
 * message naming the other userfaultfd (it used to say "tracked already by
 * another mirror", which sent one looking for a mirror that is not there). */
TEST(tracked_uffd_wrap_of_memory_another_userfaultfd_watches_says_so)
{
    need_uffd();
    mapping_device *dev = test_device();
    size_t n = 16 * page();
    unsigned char *a = anon(n);
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | 1 /* UFFD_USER_MODE_ONLY */);
    CHECK(fd >= 0);
    struct uffdio_api api = {.api = UFFD_API};
    CHECK(ioctl(fd, UFFDIO_API, &api) == 0);
    struct uffdio_register reg = {.range = {(uintptr_t)a, n}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    CHECK(ioctl(fd, UFFDIO_REGISTER, &reg) == 0);
    mapping_mirror *m = NULL;
    CHECK_STATUS(mapping_mirror_wrap(dev, a, n, MAPPING_MIRROR_TRACK_WRITES, &m), MAPPING_ERR_UNSUPPORTED);
    CHECK(m == NULL);
    CHECK(strstr(mapping_last_error_message(), "another userfaultfd") != NULL);
    close(fd); /* unregisters */
    m = tracked_wrap(dev, a, n);
    a[page()] = 0x5a;
    check_carried(m, page(), 0x5a);
    mapping_mirror_destroy(m);
    CHECK(munmap(a, n) == 0);
}
