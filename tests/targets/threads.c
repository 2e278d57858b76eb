/* 4 threads; thread t, named `worker-t`, calls hit(t) exactly (t + 1) * N times.
 * usage: threads N */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>

static long n;

__attribute__((noinline)) long hit(long t) {
  __asm__ volatile("");
  return t;
}

static void *run(void *arg) {
  long t = (long)arg, s = 0;
  char name[16];
  snprintf(name, sizeof name, "worker-%ld", t);
  prctl(PR_SET_NAME, name);
  for (long i = 0; i < (t + 1) * n; i++) s += hit(t);
  return (void *)s;
}

int main(int argc, char **argv) {
  n = argc > 1 ? atol(argv[1]) : 10000;
  pthread_t th[4];
  for (long t = 0; t < 4; t++) pthread_create(&th[t], 0, run, (void *)t);
  long total = 0;
  for (int t = 0; t < 4; t++) {
    void *r;
    pthread_join(th[t], &r);
    total += (long)r;
  }
  printf("total=%ld\n", total);
  return 0;
}
