/* A known call tree on several threads, for `weft record`.
 * usage: calltree [THREADS [wait]]   (wait: read a line from stdin first)
 * Each of THREADS threads, and then main, calls run(t) (t: 1..THREADS, main 100);
 * run calls parse(i, t) for i in 0..3; parse calls leaf(i + t) and leaf(i * t);
 * leaf(x) returns 3x. So run is called THREADS+1 times, parse 3 times as often,
 * leaf 6 times as often. Prints the sum of run's results. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long leaf(long x) {
  __asm__ volatile("");
  return 3 * x;
}

__attribute__((noinline)) long parse(long i, long t) {
  long r = leaf(i + t);
  __asm__ volatile("" : "+r"(r));
  return r + leaf(i * t);
}

__attribute__((noinline)) long run(long t) {
  long s = 0;
  for (long i = 0; i < 3; i++) s += parse(i, t);
  return s;
}

static void *thread_main(void *arg) {
  long t = (long)arg;
  return (void *)run(t);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 2;
  pthread_t th[64];
  if (n > 64) n = 64;
  long sum = 0;
  if (argc > 2) {
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
  }
  for (long t = 0; t < n; t++) pthread_create(&th[t], NULL, thread_main, (void *)(t + 1));
  for (long t = 0; t < n; t++) {
    void *r;
    pthread_join(th[t], &r);
    sum += (long)r;
  }
  sum += run(100);
  printf("sum=%ld\n", sum);
  return 0;
}
