/* weft memprof's target (crates/cli/tests/memprof.rs): a known access pattern.
 *   memprof THREADS [SCALE]
 * Objects (each from its own allocation function, so its own site):
 *   A (alloc_a, calloc 128 B)  read 1000*SCALE times by each thread
 *   B (alloc_b, malloc 64 B)   written 10*SCALE times by each thread
 *   C (alloc_c, malloc 256 B)  never touched
 *   D (alloc_d, malloc 16 B)   written 5 times, realloc'ed to 4096 B (moved: a
 *                              blocker is allocated after it), written 5 times more
 *   F, G (alloc_f, alloc_g)    memcpy(G, F, 40): one read of F, one write of G
 *   H (alloc_h)                three objects of 32 B allocated and freed in a loop
 *   E (chain_inner, called by chain_middle, called by chain_outer)  24 B, written
 *                              3 times: the allocation stack's 3 innermost frames
 *   BIG (alloc_big, 64 MiB: mmap'ed by malloc, far from the other objects, so the
 *                              heap range grows) written 7 times; then AFTER
 *                              (alloc_after, 48 B) read 13 times
 * Built twice: plain (-O2) and with `weft memprof --cflags`. Prints what
 * weft_mem_access_count says of A at the end (0 without weft). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "weft.h"

#define NOINLINE __attribute__((noinline))
static volatile long *A;
static volatile long *B;
static long scale = 1;

/* KEEP stops the call from being a tail call (the allocation's return address must
 * be in the alloc_* function, which names the site). */
#define KEEP(p) __asm__ volatile("" : : "r"(p) : "memory")
NOINLINE long *alloc_a(void) { long *p = calloc(16, 8); KEEP(p); return p; }
NOINLINE long *alloc_b(void) { long *p = malloc(64); KEEP(p); return p; }
NOINLINE char *alloc_c(void) { char *p = malloc(256); KEEP(p); return p; }
NOINLINE long *alloc_d(void) { long *p = malloc(16); KEEP(p); return p; }
NOINLINE char *alloc_f(void) { char *p = malloc(40); KEEP(p); return p; }
NOINLINE char *alloc_g(void) { char *p = malloc(40); KEEP(p); return p; }
NOINLINE void *alloc_h(void) { void *p = malloc(32); KEEP(p); return p; }
NOINLINE long *chain_inner(void) { long *p = malloc(24); KEEP(p); return p; }
NOINLINE long *chain_middle(void) { long *p = chain_inner(); KEEP(p); return p; }
NOINLINE long *chain_outer(void) { long *p = chain_middle(); KEEP(p); return p; }
NOINLINE char *alloc_big(void) { char *p = malloc(64 << 20); KEEP(p); return p; }
NOINLINE long *alloc_after(void) { long *p = malloc(48); KEEP(p); return p; }

static void *work(void *arg) {
  (void)arg;
  long sum = 0;
  /* Interleaved, so that sampled mode sees both at any time. */
  for (long i = 0; i < 1000 * scale; i++) {
    sum += A[i & 15];
    if (i % 100 == 0) B[(i / 100) & 7] = i;
  }
  return (void *)sum;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  if (argc > 2) scale = atol(argv[2]);
  A = alloc_a();
  B = alloc_b();
  char *c = alloc_c();
  volatile long *d = alloc_d();
  for (int i = 0; i < 5; i++) d[i & 1] = i;
  void *blocker = malloc(16);
  d = realloc((void *)d, 4096);
  for (int i = 0; i < 5; i++) d[100 + i] = i;
  char *f = alloc_f(), *g = alloc_g();
  volatile size_t n = 40;
  memcpy(g, f, n);
  for (int i = 0; i < 3; i++) free(alloc_h());
  volatile long *e = chain_outer();
  for (int i = 0; i < 3; i++) e[i] = i;
  volatile char *big = alloc_big();
  for (int i = 0; i < 7; i++) big[(long)i << 23] = (char)i;
  volatile long *after = alloc_after();
  long s = 0;
  for (int i = 0; i < 13; i++) s += after[i % 6];
  KEEP(s);
  if (threads <= 1) {
    work(0);
  } else {
    pthread_t t[16];
    for (int i = 0; i < threads && i < 16; i++) pthread_create(&t[i], 0, work, 0);
    for (int i = 0; i < threads && i < 16; i++) pthread_join(t[i], 0);
  }
  printf("A accesses %lu\n", weft_mem_access_count((const void *)A));
  struct weft_mem_stats st;
  printf("stat %lu objects\n", weft_mem_stat(&st));
  fflush(stdout);
  free(blocker);
  free((void *)d);
  free(c);
  free(f);
  free(g);
  free((void *)e);
  free((void *)big);
  free((void *)after);
  return 0;
}
