/* A small multi-client file server, for per-client disk accounting (Arachne's
 * Squid example, issue 14's seed 2).
 *
 *   acct_server DIR CLIENTS ROUNDS
 *
 * Writes DIR/file0 .. DIR/file6 (sizes 1000 + 733 * i bytes), then waits for a line
 * on stdin (weft is ready). Then CLIENTS clients connect at once, each over its own
 * socketpair with its own server thread: client c (address 10.0.0.{c+1}:{40000+c})
 * sends ROUNDS request lines, each a path; the server thread reads a line from the
 * socket (one-byte read()s, outside any request), then calls
 * handle_request(client_addr, path), which opens the file and reads it whole in
 * 512-byte read()s. At exit the server prints its own totals, one line per client:
 *
 *   client 10.0.0.1:40000 bytes N requests R
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FILES 7
#define MAX_CLIENTS 16

static const char *dir;
static int rounds;

struct client {
	int id;
	int sock[2]; /* [0]: the server's end, [1]: the client's */
	char addr[32];
	long bytes, requests;
};

static struct client clients[MAX_CLIENTS];

/* A request: read the file at `path` for `client_addr`; the bytes read. */
__attribute__((noipa)) long handle_request(const char *client_addr, const char *path)
{
	(void)client_addr;
	char buf[512];
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return -1;
	long total = 0, n;
	while ((n = read(fd, buf, sizeof buf)) > 0)
		total += n;
	close(fd);
	return n < 0 ? -1 : total;
}

/* One line from the socket (without its newline), or 0 at its end. */
static int read_line(int fd, char *line, size_t cap)
{
	size_t len = 0;
	char c;
	for (;;) {
		ssize_t n = read(fd, &c, 1);
		if (n <= 0)
			return len > 0 ? -1 : 0;
		if (c == '\n')
			break;
		if (len + 1 < cap)
			line[len++] = c;
	}
	line[len] = 0;
	return 1;
}

static void *serve(void *arg)
{
	struct client *c = arg;
	char path[4096];
	int r;
	while ((r = read_line(c->sock[0], path, sizeof path)) == 1) {
		long n = handle_request(c->addr, path);
		if (n < 0)
			exit(5);
		c->bytes += n;
		c->requests++;
	}
	if (r < 0)
		exit(6);
	return NULL;
}

static void *request(void *arg)
{
	struct client *c = arg;
	char line[4096];
	for (int i = 0; i < rounds; i++) {
		int n = snprintf(line, sizeof line, "%s/file%d\n", dir, (c->id * 3 + i) % FILES);
		if (write(c->sock[1], line, n) != n)
			exit(7);
	}
	shutdown(c->sock[1], SHUT_WR);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	dir = argv[1];
	int n = atoi(argv[2]);
	rounds = atoi(argv[3]);
	if (n < 1 || n > MAX_CLIENTS)
		return 2;
	static char data[1000 + 733 * FILES];
	memset(data, 'x', sizeof data);
	for (int i = 0; i < FILES; i++) {
		char path[4096];
		snprintf(path, sizeof path, "%s/file%d", dir, i);
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd < 0 || write(fd, data, 1000 + 733 * i) != 1000 + 733 * i)
			return 3;
		close(fd);
	}
	printf("ready\n");
	fflush(stdout);
	char go[16];
	if (!fgets(go, sizeof go, stdin))
		return 4;
	pthread_t server[MAX_CLIENTS], client[MAX_CLIENTS];
	for (int i = 0; i < n; i++) {
		struct client *c = &clients[i];
		c->id = i;
		snprintf(c->addr, sizeof c->addr, "10.0.0.%d:%d", i + 1, 40000 + i);
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, c->sock) != 0)
			return 8;
		pthread_create(&server[i], NULL, serve, c);
		pthread_create(&client[i], NULL, request, c);
	}
	for (int i = 0; i < n; i++) {
		pthread_join(client[i], NULL);
		pthread_join(server[i], NULL);
	}
	for (int i = 0; i < n; i++)
		printf("client %s bytes %ld requests %ld\n", clients[i].addr, clients[i].bytes,
		       clients[i].requests);
	return 0;
}
