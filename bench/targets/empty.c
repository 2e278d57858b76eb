/* Probe-cost target: calls an empty, non-inlined function N times in a timed loop.
 *
 *   empty [N] [T]   N calls (default 10^7) in each of T threads (default 1); prints
 *                   "calls=N ns_per_call=F loop_ns=T" on stdout, ns_per_call being the
 *                   wall time of the loops over N (per call of one thread: with T
 *                   threads on T cores and no contention it stays the same).
 *
 * The loop is timed inside the process with clock_gettime, so process start, agent
 * load and probe attach are excluded. `empty(i, s)` gets the loop counter in arg0 and a
 * pointer to one of four short strings in arg1. `asm volatile("")` keeps the compiler
 * from treating it as a pure/const function (which would let it delete the calls);
 * `after_empty` follows it in .text so `empty` is never the last function of .text.
 *
 * Built with -DXRAY (clang -fxray-instrument): main installs a counting XRay handler
 * and patches every sled before the timed loop, then prints the handler's count.
 */
#include <pthread.h>
#include <stdint.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef XRAY
/* The C++ header <xray/xray_interface.h> does not compile as C; its extern "C"
 * entry points, declared by hand (XRayEntryType is an int-sized enum, SUCCESS = 1). */
extern int __xray_set_handler(void (*entry)(int32_t, int));
extern int __xray_patch(void);
#define NEVER_XRAY __attribute__((xray_never_instrument))
static volatile uint64_t xray_events;
NEVER_XRAY static void count_handler(int32_t fid, int type) {
    (void)fid; (void)type;
    xray_events++;
}
#else
#define NEVER_XRAY
#endif

static const char *const names[4] = {"get", "put", "delete", "scan"};

#ifdef TWO_CLOCK_READS
/* The latency idiom's floor: the two TSC reads it cannot do without, in the
 * function itself (bench row plain_tsc2). */
#include <x86intrin.h>
static volatile uint64_t tsc_sink;
#endif

__attribute__((noinline)) void empty(long n, const char *name) {
    asm volatile("" : : "r"(n), "r"(name) : "memory");
#ifdef TWO_CLOCK_READS
    uint64_t t0 = __rdtsc();
    tsc_sink += __rdtsc() - t0;
#endif
}

__attribute__((noinline)) void after_empty(void) {
    asm volatile("");
}

NEVER_XRAY static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static struct rusage ru0; /* taken just before the timed loop(s) */

static long long us(struct timeval tv) {
    return (long long)tv.tv_sec * 1000000 + tv.tv_usec;
}

static void print_rusage(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("utime_us=%lld stime_us=%lld\n", us(ru.ru_utime) - us(ru0.ru_utime),
           us(ru.ru_stime) - us(ru0.ru_stime));
}

static long n_calls;
static pthread_barrier_t start;

NEVER_XRAY static void *loop(void *arg) {
    (void)arg;
    pthread_barrier_wait(&start);
    for (long i = 0; i < n_calls; i++)
        empty(i, names[i & 3]);
    return NULL;
}

NEVER_XRAY int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000000L;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    if (threads > 1) {
        /* Every thread runs the loop; the time is from the common start to the last end. */
        n_calls = n;
        pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
        pthread_t th[64];
        if (threads > 64)
            threads = 64;
        for (int t = 0; t < threads; t++)
            pthread_create(&th[t], NULL, loop, NULL);
        after_empty();
        getrusage(RUSAGE_SELF, &ru0);
        pthread_barrier_wait(&start);
        uint64_t t0 = now_ns();
        for (int t = 0; t < threads; t++)
            pthread_join(th[t], NULL);
        uint64_t t1 = now_ns();
        printf("calls=%ld ns_per_call=%.3f loop_ns=%llu\n", n * threads,
               n ? (double)(t1 - t0) / (double)n : 0.0, (unsigned long long)(t1 - t0));
        print_rusage();
        fflush(stdout);
        return 0;
    }
#ifdef XRAY
    __xray_set_handler(count_handler);
    if (__xray_patch() != 1) {
        fprintf(stderr, "empty: __xray_patch failed\n");
        return 1;
    }
#endif
    after_empty();
    getrusage(RUSAGE_SELF, &ru0);
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++)
        empty(i, names[i & 3]);
    uint64_t t1 = now_ns();
    printf("calls=%ld ns_per_call=%.3f loop_ns=%llu\n", n,
           n ? (double)(t1 - t0) / (double)n : 0.0, (unsigned long long)(t1 - t0));
#ifdef XRAY
    printf("xray_events=%llu\n", (unsigned long long)xray_events);
#endif
    print_rusage();
    fflush(stdout);
    return 0;
}
