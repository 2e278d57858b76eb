/* A server that forks a worker per request: `forkserver K N [exec BIN]`.
 * The parent calls work() N times, then forks K children one after another (each
 * waited for before the next); each child calls work() N times and exits 0 (or,
 * with "exec BIN", execs `BIN N` after its calls). The parent then calls done(K)
 * and prints "served K". With "posix_spawn BIN", children are posix_spawn()ed
 * (`BIN N`) instead of forked. Starts once it reads a line on stdin (the test
 * sends it when weft is in), so nothing races weft. */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

__attribute__((noipa)) long work(long i) {
  __asm__ volatile("");
  return i + 1;
}

__attribute__((noipa)) long done(long k) { return k; }

int main(int argc, char **argv) {
  long k = argc > 1 ? atol(argv[1]) : 4, n = argc > 2 ? atol(argv[2]) : 1000;
  const char *mode = argc > 3 ? argv[3] : "fork";
  const char *bin = argc > 4 ? argv[4] : NULL;
  char line[16];
  printf("ready\n");
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin))
    return 1;
  long sum = 0;
  for (long i = 0; i < n; i++)
    sum += work(i);
  char nbuf[32];
  snprintf(nbuf, sizeof nbuf, "%ld", n);
  for (long c = 0; c < k; c++) {
    pid_t pid;
    if (strcmp(mode, "posix_spawn") == 0) {
      char *args[] = {(char *)bin, nbuf, NULL};
      if (posix_spawn(&pid, bin, NULL, NULL, args, environ) != 0)
        return 2;
    } else {
      pid = fork();
      if (pid == 0) {
        long s = 0;
        for (long i = 0; i < n; i++)
          s += work(i);
        if (strcmp(mode, "exec") == 0) {
          execl(bin, bin, nbuf, (char *)NULL);
          _exit(3);
        }
        _exit(s == n * (n + 1) / 2 ? 0 : 4);
      }
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
      return 5;
  }
  done(k);
  printf("served %ld %ld\n", k, sum);
  return 0;
}
