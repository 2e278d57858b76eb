/* What weft leaves in a process. Prints "first=K": the descriptor its first open
 * got (3 unless something took one before main), then serves lines from stdin:
 * "call N" calls step() N times and prints "called N"; "tcall N" has a second
 * thread, alive from the start, call it N times and prints "tcalled N"; "open"
 * opens /dev/null and prints "fd=K" (then closes it). Exits at EOF. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noipa)) long step(long i) {
  __asm__ volatile("");
  return i;
}

static int first_open(void) {
  int fd = open("/dev/null", O_RDONLY);
  close(fd);
  return fd;
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static long asked = -1, done = -1;

static void *worker(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lock);
  for (;;) {
    while (asked < 0) pthread_cond_wait(&cond, &lock);
    long n = asked, s = 0;
    asked = -1;
    pthread_mutex_unlock(&lock);
    for (long i = 0; i < n; i++) s += step(i);
    pthread_mutex_lock(&lock);
    done = s == n * (n - 1) / 2 ? n : -1;
    pthread_cond_broadcast(&cond);
  }
  return NULL;
}

static long on_worker(long n) {
  pthread_mutex_lock(&lock);
  done = -2;
  asked = n;
  pthread_cond_broadcast(&cond);
  while (done == -2) pthread_cond_wait(&cond, &lock);
  long r = done;
  pthread_mutex_unlock(&lock);
  return r;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int first = first_open();
  /* Started before the first line: a driver counting threads after it sees both. */
  pthread_t t;
  pthread_create(&t, NULL, worker, NULL);
  printf("first=%d\n", first);
  char line[64];
  while (fgets(line, sizeof line, stdin)) {
    if (strncmp(line, "call ", 5) == 0) {
      long n = atol(line + 5), s = 0;
      for (long i = 0; i < n; i++) s += step(i);
      printf("called %ld\n", s == n * (n - 1) / 2 ? n : -1);
    } else if (strncmp(line, "tcall ", 6) == 0) {
      printf("tcalled %ld\n", on_worker(atol(line + 6)));
    } else if (strncmp(line, "open", 4) == 0) {
      printf("fd=%d\n", first_open());
    }
  }
  return 0;
}
