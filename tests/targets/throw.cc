// Return probes and C++ exceptions thrown through probed frames.
// usage: throw N
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

__attribute__((noinline)) long thrower(long k) {
  if (k == 0) throw std::runtime_error("boom");
  long r = thrower(k - 1);
  asm volatile("" : "+r"(r));
  return r + 1;
}

__attribute__((noinline)) long after(long x) {
  asm volatile("");
  return x + 1;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 100, caught = 0, s = 0;
  for (long i = 0; i < n; i++) {
    try {
      thrower(3);
    } catch (const std::exception &) {
      caught++;
    }
    s += after(i);
  }
  std::printf("caught=%ld s=%ld\n", caught, s);
  return 0;
}
