/* USDT probes with constant arguments of each width and sign (their specs read
 * `4@$-202182160`: the value as the assembler wrote it), and one probe at two
 * locations. Prints "done". */
#include <stdio.h>
#include <sys/sdt.h>

int main(void) {
  DTRACE_PROBE(app, multi);
  DTRACE_PROBE(app, multi);
  DTRACE_PROBE1(app, u4, (unsigned int)4092785136u);
  DTRACE_PROBE1(app, s4, (int)-202182160);
  DTRACE_PROBE1(app, u2, (unsigned short)61936);
  DTRACE_PROBE1(app, s2, (short)-3600);
  DTRACE_PROBE1(app, u1, (unsigned char)240);
  DTRACE_PROBE1(app, s1, (signed char)-16);
  printf("done\n");
  return 0;
}
