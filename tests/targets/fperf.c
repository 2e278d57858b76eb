/* Functions of known relative cost, for `weft fperf`.
 * usage: fperf ratio N  -- once(); then N times f() and g(): f does twice g's work;
 *                          h is never called
 *        fperf heavy N  -- N calls of a small leaf (call-heavy), in batches under
 *                          a parent, for the overhead budget
 *        fperf threads N -- 2 threads, each N calls of outer(), which calls mid()
 *                          10 times, which calls leaf() 100 times; prints the calls
 *                          made and whether every result was right
 *        fperf sleepy N -- N times nap() (sleeps 2 ms: wall time, next to no CPU
 *                          time) and burn() (spins: CPU time), for -e cputime
 *        fperf faults N -- N times fault8() (touches 8 fresh pages: 8 page faults),
 *                          fault2() (2) and reuse() (writes 8 pages it touched
 *                          before: none), for -e page-faults
 * A third argument names a file: heavy and threads go on (past N) until it
 * exists, so a test decides when they stop. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *stop_file;

/* Past its N, a loop goes on until the stop file exists. */
static int go_on(long i, long n) {
  return i < n || (stop_file && access(stop_file, F_OK) != 0);
}

static volatile unsigned long sink;

__attribute__((noinline)) static void spin(long n) {
  unsigned long s = 0;
  for (long i = 0; i < n; i++) {
    __asm__ volatile("");
    s += (unsigned long)i * 2654435761u;
  }
  sink += s;
}

#define UNIT 20000

/* f's and g's own code is all their time: the same loop, inline in each, in
 * assembly and starting on a 64-byte boundary, so both run it at the same
 * cycles per iteration on any CPU (a compiled loop's placement differs between
 * functions, and on some CPUs a loop straddling a 32-byte line runs 1.5x slower:
 * f/g came out 3.0 on one CI machine). */
static inline __attribute__((always_inline)) void work(unsigned long n) {
  unsigned long s = 0, i = 0;
  __asm__ volatile(".p2align 6\n"
                   "1:\n\t"
                   "add %[i], %[s]\n\t"
                   "add $1, %[i]\n\t"
                   "cmp %[n], %[i]\n\t"
                   "jb 1b\n"
                   : [s] "+r"(s), [i] "+r"(i)
                   : [n] "r"(n)
                   : "cc");
  sink += s;
}

__attribute__((noinline)) void g(void) { work(UNIT); }

__attribute__((noinline)) void f(void) { work(2 * UNIT); }

__attribute__((noinline)) void h(void) { spin(UNIT); }

__attribute__((noinline)) void once(void) { spin(UNIT); }

__attribute__((noinline)) void nap(void) { usleep(2000); }

__attribute__((noinline)) void burn(void) { spin(50 * UNIT); }

/* Touch `pages` fresh anonymous pages (one minor fault each), then give them back. */
static void touch_fresh(long pages) {
  long sz = sysconf(_SC_PAGESIZE);
  char *p = mmap(0, pages * sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  for (long i = 0; i < pages; i++) p[i * sz] = (char)i;
  sink += (unsigned long)p[0];
  munmap(p, pages * sz);
}

__attribute__((noinline)) void fault8(void) { touch_fresh(8); }

__attribute__((noinline)) void fault2(void) { touch_fresh(2); }

static char kept[8 * 4096];

__attribute__((noinline)) void reuse(void) {
  for (long i = 0; i < 8; i++) kept[i * 4096] += 1;
  sink += (unsigned long)kept[0];
}

__attribute__((noinline)) unsigned long leaf(unsigned long x) {
  __asm__ volatile("");
  unsigned long s = x;
  for (int i = 0; i < 40; i++) {
    __asm__ volatile("");
    s = s * 6364136223846793005u + 1442695040888963407u;
  }
  return s;
}

__attribute__((noinline)) void batch(long n) {
  unsigned long s = 0;
  for (long i = 0; i < n; i++)
    s += leaf((unsigned long)i);
  sink += s;
}

/* leaf() without a call, to check what the calls returned. */
static inline __attribute__((always_inline)) unsigned long leaf_inline(unsigned long x) {
  unsigned long s = x;
  for (int i = 0; i < 40; i++)
    s = s * 6364136223846793005u + 1442695040888963407u;
  return s;
}

static _Atomic long n_outer, n_mid, n_leaf, n_wrong;

__attribute__((noinline)) unsigned long mid(unsigned long x) {
  unsigned long s = 0;
  for (unsigned long i = 0; i < 100; i++) {
    unsigned long v = leaf(x + i);
    if (v != leaf_inline(x + i))
      n_wrong++;
    s += v;
  }
  n_mid++;
  n_leaf += 100;
  return s;
}

__attribute__((noinline)) unsigned long outer(unsigned long x) {
  unsigned long s = 0;
  for (unsigned long i = 0; i < 10; i++)
    s += mid(x * 1000 + i * 100);
  n_outer++;
  return s;
}

static long rounds;

static void *worker(void *arg) {
  unsigned long s = 0;
  for (long i = 0; go_on(i, rounds); i++)
    s += outer((unsigned long)arg * 1000000 + (unsigned long)i);
  sink += s;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: fperf ratio|heavy N\n");
    return 2;
  }
  long n = atol(argv[2]);
  if (argc > 3)
    stop_file = argv[3];
  if (strcmp(argv[1], "ratio") == 0) {
    once();
    for (long i = 0; i < n; i++) {
      f();
      g();
    }
    if (n < 0)
      h();
  } else if (strcmp(argv[1], "sleepy") == 0) {
    for (long i = 0; i < n; i++) {
      nap();
      burn();
    }
  } else if (strcmp(argv[1], "faults") == 0) {
    for (long i = 0; i < 8; i++) kept[i * 4096] = 1;
    for (long i = 0; i < n; i++) {
      fault8();
      fault2();
      reuse();
    }
  } else if (strcmp(argv[1], "threads") == 0) {
    rounds = n;
    pthread_t t[2];
    for (long i = 0; i < 2; i++)
      pthread_create(&t[i], 0, worker, (void *)i);
    for (long i = 0; i < 2; i++)
      pthread_join(t[i], 0);
    printf("outer %ld mid %ld leaf %ld wrong %ld\n", (long)n_outer, (long)n_mid, (long)n_leaf,
           (long)n_wrong);
  } else {
    for (long i = 0; go_on(i, n / 1000); i++)
      batch(1000);
  }
  /* argc as main got it: a return probe on _start must not touch it. */
  printf("argc %d done %lu\n", argc, (unsigned long)sink & 1);
  return 0;
}
