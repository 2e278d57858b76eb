/* Source lines for `uprobe:BIN@FILE:LINE` (crates/cli/tests/srcline.rs). The test
 * finds each line by the marker comment on it, never by its number, and counts
 * what the program runs: step(i) for i = 1..N (N = argv[1]); SL_THIRD for the
 * i divisible by 3; SL_LOOP's code in two places (the start, and the increment
 * and test). No waiting: under `weft -c` the program starts after the
 * probes are in. */
#include <stdio.h>
#include <stdlib.h>

volatile long total;

/* SL_NOCODE */

__attribute__((noinline)) long step(long i)
{ /* SL_OPEN */
  total += i; /* SL_ADD */
  if (i % 3 == 0) /* SL_IF */
    total += 100; /* SL_THIRD */
  return total; /* SL_RETURN */
}

int main(int argc, char **argv)
{
  long n = argc > 1 ? atol(argv[1]) : 10;
  for (long i = 1; i <= n; i++) /* SL_LOOP */
    step(i);
  printf("total=%ld\n", total);
  return 0;
}
