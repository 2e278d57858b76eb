/* What weft leaves in a process. Prints "first=K": the descriptor its first open
 * got (3 unless something took one before main), then serves lines from stdin:
 * "call N" calls step() N times and prints "called N"; "open" opens /dev/null and
 * prints "fd=K" (then closes it). Exits at EOF. */
#include <fcntl.h>
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

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("first=%d\n", first_open());
  char line[64];
  while (fgets(line, sizeof line, stdin)) {
    if (strncmp(line, "call ", 5) == 0) {
      long n = atol(line + 5), s = 0;
      for (long i = 0; i < n; i++) s += step(i);
      printf("called %ld\n", s == n * (n - 1) / 2 ? n : -1);
    } else if (strncmp(line, "open", 4) == 0) {
      printf("fd=%d\n", first_open());
    }
  }
  return 0;
}
