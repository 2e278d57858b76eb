/* Functions of known relative cost, for `weft fperf`.
 * usage: fperf ratio N  -- once(); then N times f() and g(): f does twice g's work;
 *                          h is never called
 *        fperf heavy N  -- N calls of a small leaf (call-heavy), in batches under
 *                          a parent, for the overhead budget */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The loops are inline in each function (spin is not called), so f's and g's
 * own code is all their time. */
__attribute__((noinline)) void g(void) {
  unsigned long s = 0;
  for (long i = 0; i < UNIT; i++) {
    __asm__ volatile("");
    s += (unsigned long)i * 2654435761u;
  }
  sink += s;
}

__attribute__((noinline)) void f(void) {
  unsigned long s = 0;
  for (long i = 0; i < 2 * UNIT; i++) {
    __asm__ volatile("");
    s += (unsigned long)i * 2654435761u;
  }
  sink += s;
}

__attribute__((noinline)) void h(void) { spin(UNIT); }

__attribute__((noinline)) void once(void) { spin(UNIT); }

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

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: fperf ratio|heavy N\n");
    return 2;
  }
  long n = atol(argv[2]);
  if (strcmp(argv[1], "ratio") == 0) {
    once();
    for (long i = 0; i < n; i++) {
      f();
      g();
    }
    if (n < 0)
      h();
  } else {
    for (long i = 0; i < n / 1000; i++)
      batch(1000);
  }
  printf("done %lu\n", (unsigned long)sink & 1);
  return 0;
}
