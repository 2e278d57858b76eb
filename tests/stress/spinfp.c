/* Every thread computes in vector registers without ever making a system call, so a
 * remote call (weft's dlopen of its agent) must borrow a thread in the middle of its
 * computation: its general, x87/SSE and AVX registers must all come back intact.
 * Prints "ready", then only "CORRUPT ..." (exit 3) on a wrong value.
 * usage: spinfp [NTHREADS] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "probed.h"

typedef double v4d __attribute__((vector_size(32)));

static void *spin(void *arg) {
  long seed = (long)arg;
  double a = (double)seed, b = 2.0 * (double)seed;
  v4d va = {1.0, 2.0, 3.0, 4.0}, vb = {2.0, 4.0, 6.0, 8.0};
  /* Never changes: upper ymm halves reset to zero (a restore of the SSE part only)
     show here wherever the thread was stopped. */
  v4d vk = {5.0, 6.0, 7.0, 8.0};
  long x = seed * 5, y = seed * 10;
  for (long i = 0;; i++) {
    a += 1.0;
    b += 2.0;
    va += 1.0;
    vb += 2.0;
    x += 1;
    y += 2;
    __asm__ volatile("" : "+x"(a), "+x"(b), "+x"(va), "+x"(vb), "+x"(vk), "+r"(x), "+r"(y));
    if (b != 2.0 * a || y != 2 * x || vb[0] != 2.0 * va[0] || vb[3] != 2.0 * va[3] ||
        vk[2] != 7.0 || vk[3] != 8.0) {
      printf("CORRUPT thread %ld at %ld: a=%g b=%g x=%ld y=%ld va0=%g vb0=%g va3=%g vb3=%g "
             "vk3=%g\n",
             seed, i, a, b, x, y, va[0], vb[0], va[3], vb[3], vk[3]);
      fflush(stdout);
      _exit(3);
    }
    if ((i & 0xffff) == 0) {
      CHECK(hot_jump(i), want_jump(i));
      a = b = 0;
      va = (v4d){1.0, 2.0, 3.0, 4.0};
      vb = va * 2.0;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  for (long t = 1; t < n; t++) {
    pthread_t th;
    pthread_create(&th, 0, spin, (void *)t);
  }
  printf("ready\n");
  fflush(stdout);
  spin(0);
}
