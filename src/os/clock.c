#include <errno.h>
#include <sys/prctl.h>
#include <time.h>
#include "os/os.h"

uint64_t mapping_os_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double mapping_os_now(void)
{
    return (double)mapping_os_now_ns() * 1e-9;
}

void mapping_os_sleep_until_ns(uint64_t deadline_ns)
{
    const uint64_t spin_ns = 50000; /* the scheduler's wake-up jitter */
    for (;;) {
        uint64_t now = mapping_os_now_ns();
        if (now >= deadline_ns)
            return;
        uint64_t left = deadline_ns - now;
        if (left > spin_ns) {
            uint64_t sleep_ns = left - spin_ns;
            struct timespec ts = {(time_t)(sleep_ns / 1000000000u), (long)(sleep_ns % 1000000000u)};
            nanosleep(&ts, NULL);
        }
    }
}

void mapping_os_fine_timer_slack(void)
{
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
}

void mapping_os_nap_until_ns(uint64_t deadline_ns)
{
    struct timespec ts = {(time_t)(deadline_ns / 1000000000u), (long)(deadline_ns % 1000000000u)};
    /* Linux wakes a sleeping thread up to its timer slack late (50 us by
     * default): the sleep runs with a 1 us slack, then the thread's own comes back. */
    int slack = mapping_os_worker_stream() ? 0 : prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0); /* workers: set once */
    if (slack > 1000)
        prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
    if (slack > 1000)
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
}
