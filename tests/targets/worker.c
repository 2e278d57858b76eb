/* What forkserver execs or spawns: `worker N` calls step() N times and exits 0. */
#include <stdlib.h>

__attribute__((noipa)) long step(long i) {
  __asm__ volatile("");
  return i;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 100, s = 0;
  for (long i = 0; i < n; i++)
    s += step(i);
  return s == n * (n - 1) / 2 ? 0 : 1;
}
