/* One of several processes woven by one session.
 * usage: member N
 * Prints "ready", then calls ping() every millisecond until SIGUSR1; then calls
 * work(i) for i = 0 .. N-1, prints "done" and waits for SIGUSR2 (or SIGTERM) to
 * exit 0. ping() lets a test see that the probes are live in this process before
 * it starts the counted calls. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile sig_atomic_t go, leave;

static void on_usr1(int s) { (void)s; go = 1; }
static void on_usr2(int s) { (void)s; leave = 1; }

__attribute__((noipa)) long ping(void) { return 0; }

__attribute__((noipa)) long work(long i) {
  __asm__ volatile("");
  return i * 2;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000, sum = 0;
  signal(SIGUSR1, on_usr1);
  signal(SIGUSR2, on_usr2);
  signal(SIGTERM, on_usr2);
  printf("ready\n");
  fflush(stdout);
  while (!go) {
    ping();
    usleep(1000);
  }
  for (long i = 0; i < n; i++)
    sum += work(i);
  printf("done %ld\n", sum);
  fflush(stdout);
  while (!leave)
    pause();
  return 0;
}
