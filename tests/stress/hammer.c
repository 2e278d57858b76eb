/* The smallest target for weave/unweave races: N threads calling the functions of
 * probed.h in a tight loop, checking every result.
 * Prints "ready", then "progress N" every 100 ms. usage: hammer [NTHREADS] */
#include <pthread.h>
#include <stdatomic.h>

#include "probed.h"

static atomic_long iterations;

static void *worker(void *arg) {
  for (long i = (long)arg;; i++) {
    round_of_calls(i);
    atomic_fetch_add_explicit(&iterations, 1, memory_order_relaxed);
  }
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 8;
  for (long t = 0; t < n; t++) {
    pthread_t th;
    pthread_create(&th, 0, worker, (void *)(t * 1000));
  }
  printf("ready\n");
  fflush(stdout);
  for (;;) {
    usleep(100000);
    printf("progress %ld\n", atomic_load(&iterations));
    fflush(stdout);
  }
}
