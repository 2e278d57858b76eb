/* A process that maps files weft will read as modules. usage:
 *   hostile map FILE...    maps each whole file read-execute (as a loader would map
 *                          code), so weft's /proc/PID/maps parsing sees each as a
 *                          module; files that cannot be mapped are skipped
 *   hostile dlopen PATH    dlopen()s a library
 * Prints "ready" (or "CORRUPT ..." if dlopen fails), then sleeps. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "dlopen")) {
    if (!dlopen(argv[2], RTLD_NOW)) {
      printf("CORRUPT dlopen: %s\n", dlerror());
      fflush(stdout);
      return 3;
    }
  } else if (argc > 1 && !strcmp(argv[1], "map")) {
    for (int i = 2; i < argc; i++) {
      int fd = open(argv[i], O_RDONLY);
      struct stat st;
      if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) continue;
      mmap(0, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
      close(fd);
    }
  }
  printf("ready\n");
  fflush(stdout);
  for (;;) pause();
}
