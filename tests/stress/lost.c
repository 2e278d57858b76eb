/* Produces events faster than weft drains them. usage: lost N THREADS
 * Each thread calls emit(t, i) for i in 0..N; prints "produced TOTAL". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static long n;

__attribute__((noipa)) long emit(long t, long i) {
  __asm__ volatile("");
  return t + i;
}

static void *run(void *arg) {
  long t = (long)arg, s = 0;
  for (long i = 0; i < n; i++) s += emit(t, i);
  return (void *)s;
}

int main(int argc, char **argv) {
  n = argc > 1 ? atol(argv[1]) : 100000;
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  pthread_t th[64];
  for (long t = 0; t < threads && t < 64; t++) pthread_create(&th[t], 0, run, (void *)t);
  for (int t = 0; t < threads && t < 64; t++) pthread_join(th[t], 0);
  printf("produced %ld\n", n * threads);
  return 0;
}
