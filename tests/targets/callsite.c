/* Call sites for the `call:` pointcut tests (crates/cli/tests/callsite.rs).
 *
 *   callsite          runs the workload once and prints what it did
 *   callsite wait     says "ready", waits for a line on stdin, runs the workload,
 *                     prints what it did and "done", then waits for another line
 *                     (a test attaches with -p first, and compares the code with the
 *                     file after weft is gone)
 *
 * The workload: work(a, b) is called 3 times by alpha, 5 by beta, 7 by gamma_ (and
 * once more through a function pointer), twice by delta (a tail call at -O2), once
 * by eta and once by iota (short functions whose call sits in their first bytes), and
 * parse calls the C library's strtol through the PLT 4 times. The loop counts are
 * volatile so that no -O level unrolls a call site away; `noipa` keeps every
 * function, its name and its calls as written.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOIPA __attribute__((noipa))

static volatile int three = 3, five = 5, seven = 7;
static long works;

NOIPA long work(long a, long b)
{
	works++;
	return a * b;
}

/* Reached only through a pointer (an indirect call). */
static long (*volatile indirect)(long, long) = work;

NOIPA void alpha(void)
{
	for (int i = 0; i < three; i++)
		work(i, 10);
}

NOIPA void beta(void)
{
	for (int i = 0; i < five; i++)
		work(100 + i, 20);
}

NOIPA void gamma_(void)
{
	for (int i = 0; i < seven; i++)
		work(1000 + i, 30);
	indirect(5000, 50);
	/* Code after the call: it stays a call, not an indirect tail jump. */
	__asm__ volatile("" ::: "memory");
}

NOIPA long delta(long x)
{
	return work(x, 40);
}

/* At -O2: `endbr64; jmp work` — the call is the instruction a uprobe on eta patches. */
NOIPA long eta(long a, long b)
{
	return work(a, b);
}

/* At -O2: `endbr64; mov rsi, rdi; jmp work` — the call lies inside the bytes a jump at
 * iota's entry would displace. */
NOIPA long iota(long a)
{
	return work(a, a);
}

NOIPA long parse(const char *s)
{
	return strtol(s, NULL, 10);
}

/* Called once the workload is done (a test's weft may exit here). */
NOIPA void report(long parsed)
{
	printf("alpha=%d beta=%d gamma_=%d delta=2 eta=1 iota=1 indirect=1 works=%ld "
	       "parsed=%ld\n",
	       three, five, seven, works, parsed);
	fflush(stdout);
}

static void wait_line(void)
{
	char line[64];
	if (!fgets(line, sizeof line, stdin))
		exit(0);
}

int main(int argc, char **argv)
{
	int wait = argc > 1 && strcmp(argv[1], "wait") == 0;
	static const char *const numbers[4] = {"1", "20", "300", "4000"};
	if (wait) {
		printf("ready\n");
		fflush(stdout);
		wait_line();
	}
	alpha();
	beta();
	gamma_();
	delta(7);
	delta(8);
	eta(6, 6);
	iota(9);
	long parsed = 0;
	for (int i = 0; i < 4; i++)
		parsed += parse(numbers[i]);
	report(parsed);
	if (wait) {
		printf("done\n");
		fflush(stdout);
		wait_line();
	}
	return 0;
}
