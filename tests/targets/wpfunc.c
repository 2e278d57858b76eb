/* watchpoint:FUNC+argN (crates/cli/tests/data.rs): `wpfunc N` calls increment(0, a)
 * N times, each followed by a write of its own to *a (2 writes a call); then
 * bump(b) writes *b once, and main writes it twice more; prints "a=A b=B". */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) void increment(int unused, int *i) {
  (void)unused;
  (*i)++;
}

__attribute__((noinline)) void bump(int *i) { *i += 2; }

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 1;
  int *a = malloc(sizeof(int));
  int *b = malloc(sizeof(int));
  *(volatile int *)a = 0;
  *(volatile int *)b = 0;
  for (int k = 0; k < n; k++) {
    increment(0, a);
    (*(volatile int *)a)++;
  }
  bump(b);
  (*(volatile int *)b)++;
  (*(volatile int *)b)++;
  printf("a=%d b=%d\n", *a, *b);
  return 0;
}
