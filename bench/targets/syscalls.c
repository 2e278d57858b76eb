/* Kernel-probe cost target (bench/run kernel): N getppid() system calls in a timed loop.
 *
 *   syscalls [N] [CPU]    N calls (default 2,000,000), on CPU if given (the program
 *                         pins itself first); prints
 *                         "calls=N ns_per_call=F loop_ns=T cpu=C ppid_sum=S" on stdout,
 *                         C the CPU the loop ended on.
 *   syscalls 0 wait       prints "waiting <pid>" and reads a line from stdin.
 *
 * getppid is about the cheapest system call there is (no argument, no lock), so the
 * loop's time is the kernel entry and exit plus whatever a probe on
 * syscalls:sys_enter_getppid adds. It goes through syscall(2), never through a libc
 * wrapper that could cache the answer. The loop is timed inside the process with
 * clock_gettime, so process start and the tracer's attach are excluded.
 *
 * With "wait", the program prints "waiting <pid>" and reads one line from stdin before
 * the loop: the process a tracer's session traces while the measured one runs outside
 * it. The CPU matters: bpftrace opens its tracepoint's perf event on CPU 0 only, and a
 * program running there pays more per event than on the other CPUs.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static unsigned long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 2000000L;
	if (argc > 2 && strcmp(argv[2], "wait") != 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(atoi(argv[2]), &set);
		if (sched_setaffinity(0, sizeof set, &set) != 0) {
			perror("syscalls: sched_setaffinity");
			return 1;
		}
	} else if (argc > 2) {
		char line[64];
		printf("waiting %d\n", (int)getpid());
		fflush(stdout);
		if (!fgets(line, sizeof line, stdin))
			return 2;
	}
	long sum = 0;
	unsigned long long t0 = now_ns();
	for (long i = 0; i < n; i++)
		sum += syscall(SYS_getppid);
	unsigned long long t1 = now_ns();
	printf("calls=%ld ns_per_call=%.3f loop_ns=%llu cpu=%d ppid_sum=%ld\n", n,
	       n ? (double)(t1 - t0) / (double)n : 0.0, t1 - t0, sched_getcpu(), sum);
	fflush(stdout);
	return 0;
}
