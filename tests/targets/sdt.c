/* USDT (sys/sdt.h) probes, one with a semaphore: step(i) fires app:work(i, 3i, name) and
 * app:tick(i); "enabled at i" is printed only while app:tick is woven.
 * usage: sdt N [loop]   -- with "loop", prints "ready" and runs forever (attach
 * tests); each SIGUSR1 then makes it print "mark", run 100 more steps and print
 * "after 100 steps" (so a test sees what steps after a moment of its choosing print) */
#define _SDT_HAS_SEMAPHORES 1
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/sdt.h>
unsigned short app_tick_semaphore __attribute__((unused, section(".probes")));
unsigned short app_work_semaphore __attribute__((unused, section(".probes")));
static volatile sig_atomic_t marks;
static void on_usr1(int sig) { (void)sig; marks++; }
__attribute__((noinline)) long step(long i, const char *name) {
  long v = i * 3;
  DTRACE_PROBE3(app, work, i, v, name);
  if (app_tick_semaphore) printf("enabled at %ld\n", i);
  DTRACE_PROBE1(app, tick, i);
  return v;
}
int main(int argc, char **argv) {
  if (argc > 2) {
    signal(SIGUSR1, on_usr1);
    printf("ready\n");
    fflush(stdout);
    sig_atomic_t seen = 0;
    long after = -1;
    for (long i = 0;; i++) {
      if (marks != seen) {
        seen = marks;
        printf("mark\n");
        after = 100;
      }
      step(i, "loop");
      if (after > 0 && --after == 0) printf("after 100 steps\n");
      fflush(stdout);
      usleep(2000);
    }
  }
  long n = argc > 1 ? atol(argv[1]) : 5, s = 0;
  for (long i = 0; i < n; i++) s += step(i, i % 2 ? "odd" : "even");
  printf("s=%ld\n", s);
  return 0;
}
