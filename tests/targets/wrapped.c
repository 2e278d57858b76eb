/* Run through a wrapper (`sh -c`, a `#!` script): calls malloc(4321) seven times,
 * then prints every entry of its environment that weft could have left there
 * (`LD_PRELOAD`, `WEFT_*`) as "left: ENTRY", then "checked". With an argument it
 * runs itself again through `sh -c` (a child that must not load the agent once
 * the program weft was run for has started). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

int main(int argc, char **argv) {
  for (int i = 0; i < 7; i++) {
    void *volatile p = malloc(4321);
    free(p);
  }
  for (char **e = environ; *e; e++)
    if (!strncmp(*e, "LD_PRELOAD=", 11) || !strncmp(*e, "WEFT_", 5))
      printf("left: %s\n", *e);
  printf("checked\n");
  fflush(stdout);
  if (argc > 1) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "%s", argv[0]);
    return system(cmd);
  }
  return 0;
}
