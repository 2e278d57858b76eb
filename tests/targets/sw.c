/* A program for the system-wide tests (crates/cli/tests/system_wide.rs).
 *
 *   sw N          call f() N times (and g() of libswlib N times when linked
 *                 with it: -DWITH_LIB), print the sum, exit
 *   sw N wait     print "ready PID" first and wait for SIGUSR1 (weft weaves it
 *                 meanwhile), then do the same
 *   sw N dlopen LIB   dlopen LIB, call its g() N times (no f)
 *   sw N spin     call f() until SIGTERM (a member still running when weft ends)
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) int f(int x)
{
	__asm__ volatile("");
	return x + 1;
}

#ifdef WITH_LIB
int g(int);
#endif

static volatile sig_atomic_t go, stop;
static void on_usr1(int s) { (void)s; go = 1; }
static void on_term(int s) { (void)s; stop = 1; }

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 1;
	const char *mode = argc > 2 ? argv[2] : "";
	long sum = 0;
	if (!strcmp(mode, "wait")) {
		sigset_t block, old;
		sigemptyset(&block);
		sigaddset(&block, SIGUSR1);
		sigprocmask(SIG_BLOCK, &block, &old);
		signal(SIGUSR1, on_usr1);
		printf("ready %d\n", getpid());
		fflush(stdout);
		while (!go)
			sigsuspend(&old);
	}
	if (!strcmp(mode, "dlopen")) {
		void *h = dlopen(argv[3], RTLD_NOW);
		if (!h) {
			fprintf(stderr, "%s\n", dlerror());
			return 1;
		}
		int (*g)(int) = (int (*)(int))dlsym(h, "g");
		for (int i = 0; i < n; i++)
			sum += g(i);
		printf("%ld\n", sum);
		return 0;
	}
	if (!strcmp(mode, "spin")) {
		signal(SIGTERM, on_term);
		printf("ready %d\n", getpid());
		fflush(stdout);
		while (!stop)
			sum += f((int)sum & 7);
		return 0;
	}
	for (int i = 0; i < n; i++) {
		sum += f(i);
#ifdef WITH_LIB
		sum += g(i);
#endif
	}
	printf("%ld\n", sum);
	return 0;
}
