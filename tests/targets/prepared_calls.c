/* prepared_calls.c — the program of the prepared-binary tests (issue 4), built every
 * prepared way: -finstrument-functions (+ weft coldpatch), -fpatchable-function-entry,
 * -pg -mfentry -mnop-mcount -mrecord-mcount, and plain. It always carries weft.h probes
 * (with and without a semaphore) and sys/sdt.h probes (with semaphores when built with
 * -DPREPARED_SDT_SEMAPHORES). See PREPARED.md for the builds and every count, sum and
 * argument the tests can assert; the output below is the same in every build.
 *
 * Build: gcc -I include [FLAGS] tests/targets/prepared_calls.c -o prepared_calls
 */

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "weft.h"

#ifdef PREPARED_SDT_SEMAPHORES
#define _SDT_HAS_SEMAPHORES 1
#endif
#include <sys/sdt.h>

#ifdef PREPARED_SDT_SEMAPHORES
__extension__ unsigned short prepared_sdt_pair_semaphore __attribute__((unused))
__attribute__((section(".probes")));
__extension__ unsigned short prepared_sdt_triple_semaphore __attribute__((unused))
__attribute__((section(".probes")));
#define SDT_ENABLED(name) __builtin_expect(*(volatile unsigned short *)&prepared_sdt_##name##_semaphore != 0, 0)
#else
#define SDT_ENABLED(name) 1
#endif

/* Out of line and not cloned, so every function has its own symbol, placeholder and
   exact call count at every -O level. */
#if defined(__clang__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE __attribute__((noipa))
#endif

WEFT_SEMAPHORE(prepared, gated);

static volatile long sink;
static long weft_gated_runs, sdt_gated_runs;

/* 100 calls, arguments 0..99 (sum 4950), returns 2x+1 (sum 10000). */
NOINLINE long leaf(long x) { return 2 * x + 1; }

/* 10 calls, i = 0..9; returns 200i+100 (sum 10000). */
NOINLINE long mid(int i) {
    long s = 0;
    for (int k = 0; k < 10; k++)
        s += leaf(i * 10 + k);
    WEFT_PROBE(prepared, mid_done, i, s);
    return s;
}

/* 25 calls, x = 0..24; void, so -O2 ends it with a tail call (a `jmp` exit site). */
NOINLINE void touch(long x) { sink += x; }

/* 30 calls, x = -10..19: returns -1 ten times, 0 once, 1 nineteen times. */
NOINLINE int classify(int x) {
    if (x < 0)
        return -1;
    if (x == 0)
        return 0;
    return 1;
}

/* fib(10) = 55: 177 calls, the deepest 10 frames below the first. The volatile
   results keep -O2 from turning one of the two calls into a loop. */
NOINLINE long fib(int n) {
    if (n < 2)
        return n;
    volatile long a = fib(n - 1), b = fib(n - 2);
    return a + b;
}

/* Only runs while a tracer holds the prepared:gated semaphore. */
NOINLINE long summary(long i) { return i * 1000 + 7; }

/* 1 call: a probe with all twelve arguments, of every integer kind. */
NOINLINE void twelve(signed char a1, unsigned char a2, short a3, unsigned short a4, int a5,
                     unsigned a6, long a7, unsigned long a8, const char *a9, int a10,
                     long a11, _Bool a12) {
    WEFT_PROBE(prepared, twelve, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12);
}

NOINLINE static int run(void) {
    static const char word[] = "twelve";
    long total = 0;

    WEFT_PROBE(prepared, start);
    for (int i = 0; i < 10; i++) {
        total += mid(i);
        WEFT_PROBE(prepared, tick, i, (long)i * i, -i);
        if (WEFT_PROBE_ENABLED(prepared, gated)) {
            long v = summary(i);
            WEFT_PROBE(prepared, gated, i, v);
            weft_gated_runs++;
        }
        if (SDT_ENABLED(pair)) {
            DTRACE_PROBE2(prepared_sdt, pair, i, -3 * i);
#ifdef PREPARED_SDT_SEMAPHORES
            sdt_gated_runs++;
#endif
        }
    }
    printf("mid total %ld\n", total);

    for (long x = 0; x < 25; x++)
        touch(x);
    printf("touch sink %ld\n", sink);

    int neg = 0, zero = 0, pos = 0;
    for (int x = -10; x < 20; x++) {
        int c = classify(x);
        neg += c < 0;
        zero += c == 0;
        pos += c > 0;
    }
    printf("classify -1:%d 0:%d 1:%d\n", neg, zero, pos);

    printf("fib(10) %ld\n", fib(10));

    twelve(-1, 200, -300, 60000, -70000, 4000000000u, -5000000000L, 0xfedcba9876543210UL,
           word, -12, 1L << 40, 1);
    if (SDT_ENABLED(triple))
        DTRACE_PROBE3(prepared_sdt, triple, 7, -7L, word);
    printf("twelve %s\n", word);

    printf("gated runs weft %ld sdt %ld\n", weft_gated_runs, sdt_gated_runs);
    return 0;
}

/* `prepared_calls linger`: run the program again and again (for attach tests). */
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "linger") == 0) {
        for (;;) {
            run();
            fflush(stdout);
            usleep(20000);
        }
    }
    return run();
}
