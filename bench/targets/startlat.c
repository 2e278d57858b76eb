/* Start-latency target (bench/run systemwide): reads CLOCK_MONOTONIC as main begins
 * and prints it after calling f() N times (default 1), so the benchmark can tell how
 * long exec → main took with a system-wide session (or bpftrace's uprobes) in place.
 *
 *   startlat [N]   prints "<ns at main>" on stdout
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) void f(long n)
{
	__asm__ volatile("" : : "r"(n) : "memory");
}

int main(int argc, char **argv)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	long n = argc > 1 ? atol(argv[1]) : 1;
	for (long i = 0; i < n; i++)
		f(i);
	printf("%lld\n", (long long)t.tv_sec * 1000000000LL + t.tv_nsec);
	return 0;
}
