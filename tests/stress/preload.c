/* An LD_PRELOAD library that records every process it is loaded into: appends
 * "PID EXE" to the file named at build time (-DMARK="path"). */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void mark(void) {
  char exe[512] = {0}, line[600];
  if (readlink("/proc/self/exe", exe, sizeof exe - 1) < 0) strcpy(exe, "?");
  int n = snprintf(line, sizeof line, "%d %s\n", (int)getpid(), exe);
  int fd = open(MARK, O_WRONLY | O_APPEND | O_CREAT, 0666);
  if (fd >= 0) {
    (void)!write(fd, line, n);
    close(fd);
  }
}
