/* Runs until killed, checking its own results: tick(s) must return s + 1.
 * Prints "ready" once started; exits 3 on a wrong result. Used by attach tests.
 * Built with -DIGNORE_TERM it ignores SIGTERM; with -DCRASH_AFTER=N it kills
 * itself with SIGSEGV right after its N-th tick; with -DTRAP_AFTER=N it runs an
 * int3 of its own there (no SIGTRAP handler: the trap ends it). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline)) long tick(long x) {
  __asm__ volatile("");
  return x + 1;
}

__attribute__((noinline)) long square(long x) {
  __asm__ volatile("");
  return x * x;
}

int main(void) {
  long s = 0;
#ifdef IGNORE_TERM
  signal(SIGTERM, SIG_IGN);
#endif
  printf("ready\n");
  fflush(stdout);
  for (long i = 1;; i++) {
    long r = tick(s);
    if (r != s + 1 || square(i & 1023) != (i & 1023) * (i & 1023)) {
      printf("CORRUPT at %ld\n", i);
      fflush(stdout);
      exit(3);
    }
    s = r;
#ifdef CRASH_AFTER
    if (i == CRASH_AFTER) raise(SIGSEGV);
#endif
#ifdef TRAP_AFTER
    if (i == TRAP_AFTER) __asm__ volatile("int3");
#endif
    if (i % 4096 == 0) usleep(200);
  }
}
