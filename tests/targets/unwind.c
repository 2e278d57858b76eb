/* Return probes and non-local exits: longjmp out of probed frames.
 * jumper(k) recurses k times then longjmps back to main. usage: unwind N */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

static jmp_buf env;

__attribute__((noinline)) long jumper(long k) {
  if (k == 0) longjmp(env, 1);
  long r = jumper(k - 1);
  __asm__ volatile("" : "+r"(r));
  return r + 1;
}

__attribute__((noinline)) long plain(long x) {
  __asm__ volatile("");
  return x + 7;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 100;
  long s = 0;
  for (long i = 0; i < n; i++) {
    if (setjmp(env) == 0) jumper(3);
    s += plain(i);
  }
  printf("s=%ld\n", s);
  return 0;
}
