/* Short-lived threads, one after another: TOTAL threads, at most ALIVE at once (the
 * oldest is joined before the next one starts). Thread i calls bar(i) once, then
 * foo(i, j) for j = 0 .. CALLS-1, and exits. When every thread is joined, main calls
 * done(TOTAL) and prints the sum of foo's results.
 * With "hold", every thread waits after its calls until all TOTAL threads have made
 * theirs (all of them alive at once; 64 KiB stacks).
 * usage: short_threads TOTAL ALIVE CALLS [hold] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noipa)) long foo(long i, long j) {
  __asm__ volatile("");
  return i + j;
}

__attribute__((noipa)) long bar(long i) {
  __asm__ volatile("");
  return i;
}

__attribute__((noipa)) long done(long n) {
  __asm__ volatile("");
  return n;
}

static long calls;
static int hold;
static pthread_barrier_t all_called;

static void *run(void *arg) {
  long i = (long)arg, s = 0;
  bar(i);
  for (long j = 0; j < calls; j++) s += foo(i, j);
  if (hold) pthread_barrier_wait(&all_called);
  return (void *)s;
}

static long join(pthread_t t) {
  void *r;
  int e = pthread_join(t, &r);
  if (e) {
    fprintf(stderr, "pthread_join: %s\n", strerror(e));
    exit(1);
  }
  return (long)r;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: short_threads TOTAL ALIVE CALLS\n");
    return 2;
  }
  long total = atol(argv[1]), alive = atol(argv[2]);
  calls = atol(argv[3]);
  hold = argc > 4 && !strcmp(argv[4], "hold");
  if (alive < 1) alive = 1;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (hold) {
    alive = total;
    pthread_barrier_init(&all_called, 0, total);
    pthread_attr_setstacksize(&attr, 64 * 1024);
  }
  pthread_t *th = calloc(alive, sizeof *th);
  long sum = 0;
  for (long i = 0; i < total; i++) {
    if (i >= alive) sum += join(th[i % alive]);
    int e = pthread_create(&th[i % alive], &attr, run, (void *)i);
    if (e) {
      fprintf(stderr, "pthread_create: %s\n", strerror(e));
      return 1;
    }
  }
  for (long i = total > alive ? total - alive : 0; i < total; i++) sum += join(th[i % alive]);
  done(total);
  printf("sum=%ld\n", sum);
  return 0;
}
