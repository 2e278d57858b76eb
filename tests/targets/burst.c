/* A burst of calls on a signal from the test: `burst N` says "ready", reads a
 * line from stdin, calls work(i) for i in 0..N as fast as it can, prints the sum
 * of the results and "done", reads a second line, and exits. work(x) = 2x + 1. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long work(long x) {
  __asm__ volatile("");
  return x * 2 + 1;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000000;
  char line[64];
  printf("ready\n");
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin)) return 1;
  long s = 0;
  for (long i = 0; i < n; i++) s += work(i);
  printf("sum=%ld\ndone\n", s);
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin)) return 1;
  return 0;
}
