/* Calls functions a known number of times with known arguments.
 * usage: calls N   -- work(i) for i in 0..N, tiny() N times, sum printed */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long work(long x) {
  __asm__ volatile("");
  return x * 2 + 1;
}

/* Shorter than a 5-byte jump at -O2 (xor eax,eax; ret): woven with int3. The empty
 * asm keeps GCC from treating it as a constant function and hoisting calls. */
__attribute__((noinline)) int tiny(void) {
  __asm__ volatile("");
  return 0;
}

/* A loop whose back edge targets the second instruction: a jump there would be
 * unsafe. */
__attribute__((noinline)) long spin(long n) {
  long s = 0;
  for (long i = 0; i < n; i++) {
    __asm__ volatile("");
    s += i ^ (s >> 3);
  }
  return s;
}

/* A loop that branches back into the bytes a jump would replace: the first two
 * instructions are 2 bytes each and the loop head is the second one, so this site
 * must be an int3. loopy(n) returns n (for n > 0). */
long loopy(long n);
__asm__(".text\n"
        ".globl loopy\n"
        ".type loopy, @function\n"
        "loopy:\n"
        "  xor %eax, %eax\n"
        "1: inc %eax\n"
        "  cmp %edi, %eax\n"
        "  jl 1b\n"
        "  ret\n"
        ".size loopy, .-loopy\n");

__attribute__((noinline)) long many_args(long a, long b, long c, long d, long e, long f, long g, long h) {
  __asm__ volatile("");
  return a + b + c + d + e + f + g + h;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000;
  long s = 0;
  for (long i = 0; i < n; i++) s += work(i);
  for (long i = 0; i < n; i++) s += tiny();
  s += spin(10);
  for (long i = 0; i < n; i++) s += loopy(3);
  s += many_args(1, 2, 3, 4, 5, 6, 7, 8);
  printf("sum=%ld\n", s);
  return 0;
}
