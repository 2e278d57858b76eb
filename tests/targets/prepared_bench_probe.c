/* prepared_bench_probe.c — what a weft.h probe costs while nothing is attached.
 *
 * Times two loops (see CHAIN and TIGHT below) three ways each and prints nanoseconds
 * per iteration:
 *   baseline   the loop body alone
 *   guarded    plus `if (WEFT_PROBE_ENABLED(bench, gated)) { expensive(); WEFT_PROBE(...); }`
 *              with the semaphore off (what issue 4 bounds at 0.5 ns)
 *   probe      plus an unguarded `WEFT_PROBE(bench, plain, i, acc)` (5 bytes of NOPs)
 * Each is the best of 3 x REPEATS runs of N iterations (argv[1], default 50000000).
 *
 * Build: gcc -O2 -I include tests/targets/prepared_bench_probe.c -o bench_probe
 */

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "weft.h"

WEFT_SEMAPHORE(bench, gated);

#define REPEATS 3
#define MIN(a, b) ((a) < (b) ? (a) : (b))

static long gated_runs;

__attribute__((noinline)) static long expensive(long i) {
    long s = 0;
    for (long k = 0; k < 100; k++)
        s += (i ^ k) * 31;
    return s;
}

/* Two loop bodies: `chain`, a multiply-add chain (latency-bound, ~4 cycles, where the
   guard's load and branch run alongside), and `tight`, one add (throughput-bound,
   ~1 cycle: the worst case for anything added). */
#define CHAIN(acc, i) ((acc) = (acc) * 6364136223846793005UL + (unsigned long)(i))
#define TIGHT(acc, i) ((acc) += (unsigned long)(i))

#define LOOPS(body)                                                                    \
    __attribute__((noinline)) static unsigned long body##_baseline(long n) {           \
        unsigned long acc = 1;                                                         \
        for (long i = 0; i < n; i++) {                                                 \
            body(acc, i);                                                              \
            __asm__ __volatile__("" : "+r"(acc));                                      \
        }                                                                              \
        return acc;                                                                    \
    }                                                                                  \
    __attribute__((noinline)) static unsigned long body##_guarded(long n) {            \
        unsigned long acc = 1;                                                         \
        for (long i = 0; i < n; i++) {                                                 \
            body(acc, i);                                                              \
            if (WEFT_PROBE_ENABLED(bench, gated)) {                                    \
                long e = expensive(i);                                                 \
                WEFT_PROBE(bench, gated, i, e);                                        \
                gated_runs++;                                                          \
            }                                                                          \
            __asm__ __volatile__("" : "+r"(acc));                                      \
        }                                                                              \
        return acc;                                                                    \
    }                                                                                  \
    __attribute__((noinline)) static unsigned long body##_probed(long n) {             \
        unsigned long acc = 1;                                                         \
        for (long i = 0; i < n; i++) {                                                 \
            body(acc, i);                                                              \
            WEFT_PROBE(bench, plain, i, acc);                                          \
            __asm__ __volatile__("" : "+r"(acc));                                      \
        }                                                                              \
        return acc;                                                                    \
    }

LOOPS(CHAIN)
LOOPS(TIGHT)

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static double best_ns_per_iter(unsigned long (*loop)(long), long n, unsigned long *check) {
    double best = 1e300;
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now_ns();
        *check = loop(n);
        double t = (now_ns() - t0) / (double)n;
        if (t < best)
            best = t;
    }
    return best;
}

static int report(const char *name, unsigned long (*base)(long), unsigned long (*guard)(long),
                  unsigned long (*probe)(long), long n) {
    unsigned long c0, c1, c2;
    double b = 1e300, g = 1e300, p = 1e300;
    /* Rounds interleave the three so frequency changes hit all alike. */
    for (int round = 0; round < 3; round++) {
        b = MIN(b, best_ns_per_iter(base, n, &c0));
        g = MIN(g, best_ns_per_iter(guard, n, &c1));
        p = MIN(p, best_ns_per_iter(probe, n, &c2));
    }
    if (c0 != c1 || c0 != c2) {
        fprintf(stderr, "%s: checksums differ\n", name);
        return 1;
    }
    printf("%s loop, checksum %lx\n", name, c0);
    printf("  baseline  %.3f ns/iter\n", b);
    printf("  guarded   %.3f ns/iter (%+.3f ns: WEFT_PROBE_ENABLED, semaphore off)\n", g, g - b);
    printf("  probe     %.3f ns/iter (%+.3f ns: WEFT_PROBE, nothing attached)\n", p, p - b);
    return 0;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 50000000L;
    printf("iterations %ld\n", n);
    if (report("chain", CHAIN_baseline, CHAIN_guarded, CHAIN_probed, n) ||
        report("tight", TIGHT_baseline, TIGHT_guarded, TIGHT_probed, n))
        return 1;
    printf("gated runs %ld\n", gated_runs);
    return 0;
}
