/* Call chains for `ustack`, built without frame pointers by the tests.
 * usage: stacks [N]
 * main calls level1 N times (default 5); level1 → level2 → level3 → level4, each a
 * real frame (locals on the stack, work after the call, so no tail call). Then
 * sort_things sorts 16 numbers with qsort, whose callback is by_value: its stacks
 * go through the C library's frames. The `@NAME` comments mark the lines the
 * tests expect `ustack` to report (the call in each caller, level4's entry). */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long level4(long x) { /* @L4 */
  volatile long buf[8];
  for (int i = 0; i < 8; i++) buf[i] = x * i;
  return buf[3] + buf[7];
}

__attribute__((noinline)) long level3(long x) {
  volatile long buf[4];
  buf[0] = x;
  long r = level4(x + 1); /* @L3 */
  buf[1] = r;
  return buf[0] + buf[1];
}

__attribute__((noinline)) long level2(long x) {
  volatile long buf[4];
  buf[0] = x;
  long r = level3(x * 2); /* @L2 */
  buf[1] = r;
  return buf[0] * 3 + buf[1];
}

__attribute__((noinline)) long level1(long x) {
  volatile long buf[4];
  buf[0] = x;
  long r = level2(x + 7); /* @L1 */
  buf[1] = r;
  return buf[0] ^ buf[1];
}

__attribute__((noinline)) int by_value(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return (x > y) - (x < y);
}

__attribute__((noinline)) long sort_things(void) {
  long v[16];
  for (int i = 0; i < 16; i++) v[i] = (i * 7919) % 16;
  qsort(v, 16, sizeof v[0], by_value); /* @SORT */
  return v[0] + v[15];
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 5;
  long s = 0;
  for (long i = 0; i < n; i++) {
    s += level1(i); /* @MAIN */
  }
  s += sort_things();
  printf("s=%ld\n", s);
  return 0;
}
