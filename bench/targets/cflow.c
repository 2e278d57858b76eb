/* Control-flow pointcut cost target (Arachne §4.1's `cflow` row): `zoo` calls `foo`,
 * N times in a timed loop; the native operation is those two calls.
 *
 *   cflow [N]   N iterations (default 10^7); prints
 *               "calls=N ns_per_call=F loop_ns=T" on stdout (F: ns per iteration).
 *
 * The loop is timed inside the process, as in empty.c. The barriers keep `foo` a real
 * call (not a tail call: `zoo` must be on the stack while `foo` runs) and keep the
 * compiler from deleting either function. `zoo` counts its calls first, so its first
 * instruction is not the call: a call among the bytes a probe displaces is emulated
 * (the callee returns straight into the function's code), which costs every call a
 * return misprediction, whatever the probe.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) void foo(long n) {
    asm volatile("" : : "r"(n) : "memory");
}

static volatile long zoo_calls;

__attribute__((noinline)) void zoo(long n) {
    zoo_calls++;
    foo(n);
    asm volatile("" ::: "memory");
}

__attribute__((noinline)) void after_zoo(void) {
    asm volatile("");
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000000L;
    after_zoo();
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++)
        zoo(i);
    uint64_t t1 = now_ns();
    printf("calls=%ld ns_per_call=%.3f loop_ns=%llu\n", n,
           n ? (double)(t1 - t0) / (double)n : 0.0, (unsigned long long)(t1 - t0));
    fflush(stdout);
    return 0;
}
