/* weft memprof's sampled-mode target (crates/cli/tests/memprof.rs): 20 objects
 * (alloc_rate, 64 B each, allocated in order 0..19) read at rates far apart:
 * object i is read round(1.3^i * 4) times per round, so each is read 1.3 times as
 * often as the one before it (about 2,500 reads per round in all).
 *   memprof_rates ROUNDS
 * Prints the reads of each object (the known order) and their sum. */
#include <stdio.h>
#include <stdlib.h>

#define N 20
#define NOINLINE __attribute__((noinline))
#define KEEP(p) __asm__ volatile("" : : "r"(p) : "memory")
NOINLINE long *alloc_rate(void) { long *p = calloc(8, 8); KEEP(p); return p; }

int main(int argc, char **argv) {
  long rounds = argc > 1 ? atol(argv[1]) : 1000;
  volatile long *obj[N];
  long per[N];
  double w = 4;
  for (int i = 0; i < N; i++) {
    obj[i] = alloc_rate();
    per[i] = (long)(w + 0.5);
    w *= 1.3;
  }
  long sum = 0;
  for (long r = 0; r < rounds; r++)
    for (int i = 0; i < N; i++) {
      volatile long *o = obj[i];
      for (long k = 0; k < per[i]; k++) sum += o[k & 7];
    }
  for (int i = 0; i < N; i++) printf("%ld ", per[i] * rounds);
  printf("\nsum %ld\n", sum);
  for (int i = 0; i < N; i++) free((void *)obj[i]);
  return 0;
}
