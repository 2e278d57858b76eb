/* Connects to an abstract SOCK_SEQPACKET socket (as weft's agent would) and sends a
 * forged message; prints what the other side did:
 *   "refused"      connect failed
 *   "closed"       the peer closed the connection without a word
 *   "reply N"      the peer sent N bytes back (it took us for its agent)
 *   "silent"       nothing within 3 s
 * usage: sockpeer NAME */
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  size_t n = strlen(argv[1]);
  memcpy(a.sun_path + 1, argv[1], n);
  if (connect(fd, (struct sockaddr *)&a, sizeof(sa_family_t) + 1 + n) != 0) {
    printf("refused\n");
    return 0;
  }
  /* A forged "hello": a tag and garbage. */
  unsigned char msg[256];
  memset(msg, 0x41, sizeof msg);
  msg[0] = 1;
  msg[1] = msg[2] = msg[3] = 0;
  (void)!write(fd, msg, sizeof msg);
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (poll(&p, 1, 3000) <= 0) {
    printf("silent\n");
    return 0;
  }
  char buf[4096];
  ssize_t r = read(fd, buf, sizeof buf);
  if (r <= 0)
    printf("closed\n");
  else
    printf("reply %zd\n", r);
  return 0;
}
