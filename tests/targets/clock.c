/* nsecs against the program's own clock (crates/cli/tests/hotpath.rs).
 *
 *   clock N [US]  waits for a line on stdin, then N times reads CLOCK_MONOTONIC
 *                 and passes it to stamp(), sleeping US microseconds after each
 *                 call when given; prints "done".
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile long sink;

__attribute__((noinline)) void stamp(long ns) { sink = ns; }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    long us = argc > 2 ? atol(argv[2]) : 0;
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    for (long i = 0; i < n; i++) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        stamp(t.tv_sec * 1000000000L + t.tv_nsec);
        if (us > 0)
            usleep(us);
    }
    puts("done");
    return 0;
}
