// C++ exceptions through probed frames, in 3 threads at once.
//   thrower(k)  recurses k times and throws at the bottom
//   catcher(k)  a probed frame that catches what thrower throws below it, then
//               returns normally (it is not unwound)
//   rethrower   catches and rethrows (_Unwind_Resume_or_Rethrow)
// Every result is checked: CORRUPT + exit 3. progress = exceptions caught.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <unistd.h>

extern "C" {
#include "probed.h"
}

static std::atomic<long> progress;

__attribute__((noipa)) long thrower(long k) {
  if (k == 0) throw std::runtime_error("boom");
  long r = thrower(k - 1);
  asm volatile("" : "+r"(r));
  return r + 1;
}

__attribute__((noipa)) long catcher(long k) {
  try {
    thrower(k);
  } catch (const std::runtime_error &) {
    return k + 100;
  }
  return -1;
}

__attribute__((noipa)) long rethrower(long k) {
  try {
    thrower(k);
  } catch (...) {
    throw;
  }
  return -1;
}

static void work(long seed) {
  for (long i = seed;; i++) {
    long k = i % 5;
    CHECK(catcher(k), k + 100);
    try {
      rethrower(k);
      CHECK(0, 1);
    } catch (const std::exception &) {
    }
    round_of_calls(i);
    progress.fetch_add(2, std::memory_order_relaxed);
  }
}

int main() {
  std::thread a(work, 1), b(work, 2), c(work, 3);
  printf("ready\n");
  fflush(stdout);
  for (;;) {
    usleep(100000);
    printf("progress %ld\n", progress.load());
    fflush(stdout);
  }
}
