/* Aspect-cost target (Arachne §4.1's table): a timed loop of one of
 *
 *   aspects call N    f1(i)                       one call
 *   aspects seq N     f1(i); f2(i); f3(i)         a sequence of three calls
 *   aspects nest N    outer(i), which calls inner(i)   two nested calls
 *
 * prints "calls=N ns_per_call=F" (F per loop iteration, timed inside the process:
 * start-up and weaving excluded). The functions are empty but not pure, and none
 * is inlined, so every call stays.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FN(name)                                                                  \
    __attribute__((noinline)) long name(long x) {                                 \
        asm volatile("" : : "r"(x) : "memory");                                   \
        return x;                                                                 \
    }
FN(f1)
FN(f2)
FN(f3)
FN(inner)

/* outer counts its calls first, so its first instruction is not the call: a call
 * among the bytes a probe displaces is emulated (inner then returns straight into
 * outer's code, not to where the return predictor expects), which would cost every
 * call a misprediction whatever the probe. */
static volatile long outer_calls;

__attribute__((noinline)) long outer(long x) {
    outer_calls++;
    asm volatile("" : : "r"(x) : "memory");
    return inner(x) + 1;
}

static unsigned long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "call";
    long n = argc > 2 ? atol(argv[2]) : 10000000;
    long sum = 0;
    unsigned long long t0 = now_ns();
    if (strcmp(mode, "seq") == 0) {
        for (long i = 0; i < n; i++)
            sum += f1(i) + f2(i) + f3(i);
    } else if (strcmp(mode, "nest") == 0) {
        for (long i = 0; i < n; i++)
            sum += outer(i);
    } else {
        for (long i = 0; i < n; i++)
            sum += f1(i);
    }
    unsigned long long t1 = now_ns();
    printf("calls=%ld ns_per_call=%.3f sum=%ld\n", n, (double)(t1 - t0) / (double)n, sum);
    return 0;
}
