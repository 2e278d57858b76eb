/* Recursion depth N with return probes. depth(k) returns k, recursing to 0.
 * usage: recurse N */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long depth(long k) {
  if (k == 0) return 0;
  long r = depth(k - 1);
  __asm__ volatile("" : "+r"(r));
  return r + 1;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000;
  printf("depth=%ld\n", depth(n));
  return 0;
}
