/* A known call tree for `weft replay`, `report` and `dump`:
 * main(argc) → a(1) → b(1), b(2), b(3); main → c(5); and, on a second thread that
 * main waits for before calling a, worker(0) → d(1), d(2). b(x) returns 2x, a the
 * sum (12), c(k) k + 2, d(k) k + 1; worker and main return 0. */
#include <pthread.h>
#include <stdio.h>

__attribute__((noinline)) long b(long x) {
  __asm__ volatile("");
  return 2 * x;
}

__attribute__((noinline)) long a(long n) {
  long s = 0;
  for (long i = 0; i < 3; i++) s += b(n + i);
  return s;
}

__attribute__((noinline)) long c(long k) {
  __asm__ volatile("");
  return k + 2;
}

__attribute__((noinline)) long d(long k) {
  __asm__ volatile("");
  return k + 1;
}

__attribute__((noinline)) void *worker(void *p) {
  d(1);
  d(2);
  return p;
}

int main(int argc, char **argv) {
  (void)argv;
  pthread_t t;
  pthread_create(&t, NULL, worker, NULL);
  pthread_join(t, NULL);
  long r = a(argc) + c(5);
  printf("r=%ld\n", r);
  return r == 19 ? 0 : 1;
}
