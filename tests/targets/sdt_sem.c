/* A USDT probe whose argument is its own semaphore, read just before it fires (as
 * programs build a probe's costly arguments only when a tracer is there): every
 * hit of a woven probe must carry 1. Prints "ready", then loops forever. */
#define _SDT_HAS_SEMAPHORES 1
#include <stdio.h>
#include <sys/sdt.h>
unsigned short app_seen_semaphore __attribute__((unused, section(".probes")));
int main(void) {
  printf("ready\n");
  fflush(stdout);
  for (;;) {
    unsigned v = *(volatile unsigned short *)&app_seen_semaphore;
    DTRACE_PROBE1(app, seen, v);
  }
}
