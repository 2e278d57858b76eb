/* Drives kernel tracepoints from user space, for the kernel-probe tests.
 *
 *   tp N M [KIDS [DIR]]   N calls of work(M), each making M getppid() system calls;
 *                         then KIDS children, each making M getppid() calls; with
 *                         DIR, first opens (creating) DIR/f0 .. DIR/f{N-1}.
 *   tp wait M             waits for SIGUSR1, then makes M getppid() calls (a process
 *                         a test starts before weft and lets go once weft is ready).
 *   tp rename NAME        renames its thread NAME (prctl), then exits.
 *   tp serve R [wait]     R requests: request i is handle(client 1 + i % 3), which
 *                         reads 100 * client bytes from /dev/zero in one read();
 *                         between requests it reads 4096 bytes outside handle();
 *                         with "wait", then says "served" and waits for SIGUSR1.
 *   tp race PATH          stat()s PATH, says "checked", waits for SIGUSR1, then
 *                         open()s PATH (a check-then-use window another process may
 *                         use to replace the file).
 *   tp toctou PATH WHO    the same window without a signal: stat()s PATH; then
 *                         WHO replaces it: "other" forks a child that execs
 *                         `tp replace PATH` (another process) and waits for it,
 *                         "modifier" one that execs `tp modify PATH`, "self"
 *                         replaces it in this process, "none" leaves it;
 *                         then open()s PATH for reading and says "opened PID
 *                         REPLACER" (its pid, the child's pid or 0).
 *   tp replace PATH       replaces PATH by a new file (unlink, then create it with
 *                         open(O_WRONLY | O_CREAT | O_EXCL) and write "v2").
 *   tp modify PATH        rewrites PATH in place (open(O_WRONLY | O_TRUNC), "v3").
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) void work(int m)
{
	for (int i = 0; i < m; i++)
		getppid();
	__asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) long handle(int client, int fd)
{
	static char buf[512];
	long n = read(fd, buf, 100 * client);
	__asm__ volatile("" ::: "memory");
	return n;
}

static volatile sig_atomic_t go;
static void on_usr1(int sig) { (void)sig; go = 1; }

/* Says `what` and waits for SIGUSR1. */
static void wait_usr1(const char *what)
{
	sigset_t block, old;
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigprocmask(SIG_BLOCK, &block, &old);
	signal(SIGUSR1, on_usr1);
	printf("%s\n", what);
	fflush(stdout);
	while (!go)
		sigsuspend(&old);
}

/* Replace `path` by a new file; 0 on success. */
static int replace(const char *path)
{
	if (unlink(path) != 0)
		return 1;
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (fd < 0)
		return 1;
	int bad = write(fd, "v2", 2) != 2;
	return close(fd) != 0 || bad;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "replace") == 0)
		return replace(argv[2]) ? 9 : 0;
	if (argc == 3 && strcmp(argv[1], "modify") == 0) {
		int fd = open(argv[2], O_WRONLY | O_TRUNC);
		if (fd < 0 || write(fd, "v3", 2) != 2)
			return 9;
		return close(fd) != 0 ? 9 : 0;
	}
	if (argc == 4 && strcmp(argv[1], "toctou") == 0) {
		struct stat st;
		pid_t p = 0;
		if (stat(argv[2], &st) != 0)
			return 6;
		int other = strcmp(argv[3], "other") == 0;
		if (other || strcmp(argv[3], "modifier") == 0) {
			p = fork();
			if (p == 0) {
				execl("/proc/self/exe", argv[0], other ? "replace" : "modify", argv[2],
				      (char *)NULL);
				_exit(10);
			}
			int status;
			if (p < 0 || waitpid(p, &status, 0) != p || !WIFEXITED(status) ||
			    WEXITSTATUS(status) != 0)
				return 11;
		} else if (strcmp(argv[3], "self") == 0) {
			if (replace(argv[2]) != 0)
				return 9;
		} else if (strcmp(argv[3], "none") != 0) {
			return 2;
		}
		int fd = open(argv[2], O_RDONLY);
		if (fd < 0)
			return 7;
		close(fd);
		printf("opened %d %d\n", (int)getpid(), (int)p);
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "wait") == 0) {
		wait_usr1("waiting");
		work(atoi(argv[2]));
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "race") == 0) {
		struct stat st;
		if (stat(argv[2], &st) != 0)
			return 6;
		wait_usr1("checked");
		int fd = open(argv[2], O_RDONLY);
		if (fd < 0)
			return 7;
		close(fd);
		return 0;
	}
	if ((argc == 3 || argc == 4) && strcmp(argv[1], "serve") == 0) {
		int fd = open("/dev/zero", O_RDONLY);
		static char other[4096];
		for (int i = 0; i < atoi(argv[2]); i++) {
			if (handle(1 + i % 3, fd) != 100 * (1 + i % 3))
				return 4;
			if (read(fd, other, sizeof other) != sizeof other)
				return 5;
		}
		if (argc == 4)
			wait_usr1("served");
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "rename") == 0)
		return prctl(PR_SET_NAME, argv[2], 0, 0, 0) != 0;
	if (argc < 3)
		return 2;
	int n = atoi(argv[1]), m = atoi(argv[2]);
	int kids = argc > 3 ? atoi(argv[3]) : 0;
	if (argc > 4) {
		char path[4096];
		for (int i = 0; i < n; i++) {
			snprintf(path, sizeof path, "%s/f%d", argv[4], i);
			int fd = open(path, O_RDONLY | O_CREAT, 0600);
			if (fd < 0)
				return 3;
			close(fd);
		}
	}
	for (int i = 0; i < n; i++)
		work(m);
	for (int k = 0; k < kids; k++) {
		pid_t p = fork();
		if (p == 0) {
			work(m);
			_exit(0);
		}
		waitpid(p, NULL, 0);
	}
	return 0;
}
