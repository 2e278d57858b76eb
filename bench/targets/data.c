/* Data pointcuts' bench target (bench/run data): a loop of writes to (or reads of)
 * a global, timed inside the process.
 *
 *   data write N   `counter = counter + 1` N times
 *   data read N    `sum += source` N times
 *
 * prints "calls=N ns_per_call=F counter=C sum=S" (F per loop iteration).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

volatile long counter;
volatile long source = 1;

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    long n = atol(argv[2]), sum = 0;
    int reads = !strcmp(argv[1], "read");
    long t0 = now_ns();
    if (reads)
        for (long i = 0; i < n; i++)
            sum += source;
    else
        for (long i = 0; i < n; i++)
            counter = counter + 1;
    long t1 = now_ns();
    printf("calls=%ld ns_per_call=%.3f counter=%ld sum=%ld\n", n, (double)(t1 - t0) / (double)n,
           counter, sum);
    return 0;
}
