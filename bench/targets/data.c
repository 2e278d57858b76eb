/* Data pointcuts' bench target (bench/run data): a loop of writes to (or reads of)
 * a global, timed inside the process.
 *
 *   data write N   `counter = counter + 1` N times
 *   data read N    `sum += source` N times
 *   data alias N   `sum += *alias` N times, `alias` a pointer to `source` (Arachne's
 *                  "local alias read": no instruction names `source`)
 *   data floor N   the writes, with the program's own perf breakpoint event on
 *                  `counter` (synchronous SIGTRAP, an empty handler): the kernel's
 *                  cost per hit, without weft
 *   data hot N     `shared.hot = shared.hot + 1` N times: the word beside
 *                  `shared.watched` on one page (what page protection costs the
 *                  program's unrelated data; `watched` is never written)
 *
 * prints "calls=N ns_per_call=F counter=C sum=S" (F per loop iteration).
 */
#define _GNU_SOURCE
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

volatile long counter;
volatile long source = 1;
static volatile long traps;
volatile long *volatile alias = &source;
/* Two words on one page (the struct is 16-byte aligned, so never split). */
struct {
    long hot;
    long watched;
} __attribute__((aligned(16))) volatile shared;

static void on_trap(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)si, (void)uc;
    traps++;
}

/* The kernel's part of a hardware watchpoint: a perf breakpoint event on
 * `counter` delivering a synchronous SIGTRAP to an empty handler. */
static int watch_self(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &sa, NULL);
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_BREAKPOINT;
    a.size = sizeof a;
    a.bp_type = HW_BREAKPOINT_W;
    a.bp_addr = (unsigned long)&counter;
    a.bp_len = HW_BREAKPOINT_LEN_8;
    a.sample_period = 1;
    a.sigtrap = 1;
    a.remove_on_exec = 1;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    return syscall(SYS_perf_event_open, &a, 0, -1, -1, 0) < 0 ? -1 : 0;
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    long n = atol(argv[2]), sum = 0;
    int reads = !strcmp(argv[1], "read"), aliased = !strcmp(argv[1], "alias");
    int hot = !strcmp(argv[1], "hot");
    if (!strcmp(argv[1], "floor") && watch_self() != 0) {
        perror("perf_event_open");
        return 1;
    }
    long t0 = now_ns();
    if (reads)
        for (long i = 0; i < n; i++)
            sum += source;
    else if (aliased)
        for (long i = 0; i < n; i++)
            sum += *alias;
    else if (hot)
        for (long i = 0; i < n; i++)
            shared.hot = shared.hot + 1;
    else
        for (long i = 0; i < n; i++)
            counter = counter + 1;
    long t1 = now_ns();
    printf("calls=%ld ns_per_call=%.3f counter=%ld sum=%ld traps=%ld\n", n,
           (double)(t1 - t0) / (double)n, counter, sum, traps);
    return 0;
}
