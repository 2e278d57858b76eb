/* SystemTap scripts' target (crates/cli/tests/stap.rs): work(i, &p) for i in 0..N,
 * lat(i * 10), parity(i) (an int: -1 or 1), label(i), and two SDT marks per step.
 * usage: stap N */
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>
struct point {
  long x;
  long y;
  const char *name;
};
__attribute__((noinline, noipa)) long work(long n, struct point *p) {
  DTRACE_PROBE2(app, step, n, p->y);
  return n * 2 + p->x;
}
__attribute__((noinline, noipa)) long lat(long v) { return v; }
__attribute__((noinline, noipa)) int parity(long v) { return v % 2 ? -1 : 1; }
__attribute__((noinline, noipa)) const char *label(int i) {
  const char *s = i % 2 ? "odd" : "even";
  DTRACE_PROBE1(app, label, s);
  return s;
}
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 10;
  struct point p = {3, 4, "pt"};
  long s = 0;
  for (long i = 0; i < n; i++) {
    s += work(i, &p);
    lat(i * 10);
    parity(i);
    label((int)i);
  }
  printf("s=%ld\n", s);
  return 0;
}
