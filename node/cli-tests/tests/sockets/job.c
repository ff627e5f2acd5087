#define _GNU_SOURCE
/* The socket cases of tests/sockets.rs, one per first argument; each prints what it saw
 * (errno by name) so that the test compares lines. Built dynamically linked by gcc. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static const char *name_of(int error) {
    switch (error) {
    case 0: return "0";
    case EAGAIN: return "EAGAIN";
    case EINPROGRESS: return "EINPROGRESS";
    case ECONNREFUSED: return "ECONNREFUSED";
    case ECONNRESET: return "ECONNRESET";
    case EPIPE: return "EPIPE";
    case EINTR: return "EINTR";
    case EMFILE: return "EMFILE";
    case EACCES: return "EACCES";
    case EADDRINUSE: return "EADDRINUSE";
    case ENOTSOCK: return "ENOTSOCK";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case EPROTONOSUPPORT: return "EPROTONOSUPPORT";
    case ENODEV: return "ENODEV";
    case ENOTTY: return "ENOTTY";
    case EFAULT: return "EFAULT";
    default: return strerror(error);
    }
}

#define CHECK(call) do { if ((call) < 0) { printf("%s: %s\n", #call, name_of(errno)); return 1; } } while (0)

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(port)};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return address;
}

/* Connects to the host's echo server on `port`, sends a line in two pieces (writev-like
 * sendmsg), reads the echo, then a refused connection. */
static int tcp_client(int port, int refused_port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd);
    struct sockaddr_in address = loopback(port);
    CHECK(connect(fd, (struct sockaddr *)&address, sizeof address));
    char first[] = "hello ", second[] = "from the enclave\n";
    struct iovec pieces[2] = {{first, strlen(first)}, {second, strlen(second)}};
    struct msghdr message = {.msg_iov = pieces, .msg_iovlen = 2};
    CHECK(sendmsg(fd, &message, 0));
    char line[128] = "";
    size_t got = 0;
    while (got < strlen(first) + strlen(second)) {
        ssize_t count = recv(fd, line + got, sizeof line - 1 - got, 0);
        CHECK(count);
        if (count == 0) break;
        got += count;
    }
    printf("echo: %s", line);
    struct sockaddr_in peer;
    socklen_t len = sizeof peer;
    CHECK(getpeername(fd, (struct sockaddr *)&peer, &len));
    printf("peer port matches: %d\n", ntohs(peer.sin_port) == port);
    close(fd);
    int refused = socket(AF_INET, SOCK_STREAM, 0);
    address = loopback(refused_port);
    int result = connect(refused, (struct sockaddr *)&address, sizeof address);
    printf("refused: %d %s\n", result, name_of(errno));
    return 0;
}

/* IPv6 and datagrams: a TCP client of the host's echo server on [::1]:`port`, a UDP socket
 * on ::1 sending to itself, and a Unix datagram pair that keeps message boundaries. */
static int six(int port) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 address = {.sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = in6addr_loopback};
    CHECK(connect(fd, (struct sockaddr *)&address, sizeof address));
    CHECK(write(fd, "six", 3));
    char buffer[64] = "";
    CHECK(read(fd, buffer, 3));
    printf("tcp6 echo: %s\n", buffer);
    int udp = socket(AF_INET6, SOCK_DGRAM, 0);
    struct sockaddr_in6 self = {.sin6_family = AF_INET6, .sin6_addr = in6addr_loopback};
    socklen_t len = sizeof self;
    CHECK(bind(udp, (struct sockaddr *)&self, sizeof self));
    CHECK(getsockname(udp, (struct sockaddr *)&self, &len));
    CHECK(sendto(udp, "to itself", 9, 0, (struct sockaddr *)&self, sizeof self));
    memset(buffer, 0, sizeof buffer);
    CHECK(recv(udp, buffer, sizeof buffer - 1, 0));
    printf("udp6: %s\n", buffer);
    int pair[2];
    CHECK(socketpair(AF_UNIX, SOCK_DGRAM, 0, pair));
    CHECK(send(pair[0], "one", 3, 0));
    CHECK(send(pair[0], "two", 3, 0));
    char first[64] = "", second[64] = "";
    CHECK(recv(pair[1], first, sizeof first - 1, 0));
    CHECK(recv(pair[1], second, sizeof second - 1, 0));
    printf("unix datagrams: %s, %s\n", first, second);
    return 0;
}

/* select over a connected socket: nothing to read before the echo server has something,
 * then readable once it echoed. */
static int selecting(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in address = loopback(port);
    CHECK(connect(fd, (struct sockaddr *)&address, sizeof address));
    fd_set readable;
    FD_ZERO(&readable);
    FD_SET(fd, &readable);
    struct timeval none = {0, 0};
    printf("select, nothing yet: %d\n", select(fd + 1, &readable, NULL, NULL, &none));
    CHECK(send(fd, "sel", 3, 0));
    FD_ZERO(&readable);
    FD_SET(fd, &readable);
    struct timeval wait = {10, 0};
    int ready = select(fd + 1, &readable, NULL, NULL, &wait);
    printf("select: %d, the socket %d\n", ready, FD_ISSET(fd, &readable) ? 1 : 0);
    return 0;
}

/* Connects to the host's resetting server on `port`, sends a byte and waits: the server
 * answers with a reset (SO_LINGER 0), which ends the wait with ECONNRESET. */
static int reset(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in address = loopback(port);
    CHECK(connect(fd, (struct sockaddr *)&address, sizeof address));
    CHECK(send(fd, "x", 1, 0));
    char byte;
    ssize_t got = recv(fd, &byte, 1, 0);
    printf("recv after a reset: %zd %s\n", got, got < 0 ? name_of(errno) : "0");
    return 0;
}

/* Listens on an ephemeral port, writes it to `port_file`, accepts one connection, echoes
 * what comes until the peer closes, then writes to the closed peer: EPIPE and SIGPIPE. */
static int tcp_server(const char *port_file) {
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(listener);
    int one = 1;
    CHECK(setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one));
    struct sockaddr_in address = loopback(0);
    CHECK(bind(listener, (struct sockaddr *)&address, sizeof address));
    CHECK(listen(listener, 4));
    socklen_t len = sizeof address;
    CHECK(getsockname(listener, (struct sockaddr *)&address, &len));
    FILE *file = fopen(port_file, "w");
    fprintf(file, "%d\n", ntohs(address.sin_port));
    fclose(file);
    int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    CHECK(fd);
    char buffer[65536];
    size_t total = 0;
    for (;;) {
        ssize_t count = read(fd, buffer, sizeof buffer);
        CHECK(count);
        if (count == 0) break;
        total += count;
        CHECK(write(fd, buffer, count));
    }
    printf("echoed %zu bytes\n", total);
    signal(SIGPIPE, SIG_IGN);
    ssize_t sent = 0;
    for (int i = 0; i < 100 && sent >= 0; i++) sent = send(fd, "x", 1, 0);
    printf("send after the peer closed: %s\n", name_of(errno));
    return 0;
}

/* A datagram to the host's UDP echo on `port`, and its answer with the sender's address. */
static int udp(int port) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(fd);
    struct sockaddr_in address = loopback(port);
    CHECK(sendto(fd, "datagram", 8, 0, (struct sockaddr *)&address, sizeof address));
    char buffer[64] = "";
    struct sockaddr_in from;
    socklen_t len = sizeof from;
    ssize_t count = recvfrom(fd, buffer, sizeof buffer - 1, 0, (struct sockaddr *)&from, &len);
    CHECK(count);
    printf("udp: %s from port %d\n", buffer, ntohs(from.sin_port) == port);
    return 0;
}

/* A socketpair both ways, and a Unix stream to the host's listener at relative `path`. */
static int unix_sockets(const char *path) {
    int pair[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, pair));
    CHECK(write(pair[0], "ping", 4));
    char buffer[64] = "";
    CHECK(read(pair[1], buffer, 4));
    CHECK(write(pair[1], "pong", 4));
    CHECK(read(pair[0], buffer + 4, 4));
    printf("pair: %s\n", buffer);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strncpy(address.sun_path, path, sizeof address.sun_path - 1);
    CHECK(connect(fd, (struct sockaddr *)&address, sizeof address));
    CHECK(write(fd, "unix\n", 5));
    memset(buffer, 0, sizeof buffer);
    CHECK(read(fd, buffer, sizeof buffer - 1));
    printf("unix echo: %s", buffer);
    return 0;
}

/* Non-blocking: connect in progress, poll for writable, SO_ERROR, EAGAIN on an empty
 * socket, then epoll (with a pipe in the same set) until the host's echo arrives. */
static int readiness(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    CHECK(fd);
    struct sockaddr_in address = loopback(port);
    int result = connect(fd, (struct sockaddr *)&address, sizeof address);
    printf("connect: %s\n", result == 0 ? "0" : name_of(errno));
    struct pollfd entry = {.fd = fd, .events = POLLOUT};
    CHECK(poll(&entry, 1, 5000));
    int error = -1;
    socklen_t len = sizeof error;
    CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len));
    printf("writable: %d, SO_ERROR %s\n", (entry.revents & POLLOUT) != 0, name_of(error));
    char buffer[64] = "";
    result = recv(fd, buffer, sizeof buffer, 0);
    printf("empty: %d %s\n", result, name_of(errno));
    int pipe_ends[2];
    CHECK(pipe(pipe_ends));
    int epoll = epoll_create1(0);
    struct epoll_event event = {.events = EPOLLIN, .data.fd = fd};
    CHECK(epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event));
    event.data.fd = pipe_ends[0];
    CHECK(epoll_ctl(epoll, EPOLL_CTL_ADD, pipe_ends[0], &event));
    printf("nothing yet: %d\n", epoll_wait(epoll, &event, 1, 0));
    CHECK(send(fd, "ready?\n", 7, 0));
    int ready = epoll_wait(epoll, &event, 1, 5000);
    printf("ready: %d, the socket: %d\n", ready, event.data.fd == fd);
    result = recv(fd, buffer, sizeof buffer - 1, 0);
    printf("got: %.*s", result, buffer);
    fcntl(fd, F_SETFL, 0);
    printf("blocking again: %d\n", !(fcntl(fd, F_GETFL) & O_NONBLOCK));
    return 0;
}

/* SCM_RIGHTS: one end of a socketpair passed over another pair, then used; a pipe refused. */
static int rights(void) {
    int carrier[2], inner[2], pipe_ends[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, carrier));
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, inner));
    char byte = 'x';
    struct iovec piece = {&byte, 1};
    union { struct cmsghdr header; char space[CMSG_SPACE(sizeof(int))]; } control;
    memset(&control, 0, sizeof control);
    struct msghdr message = {.msg_iov = &piece, .msg_iovlen = 1, .msg_control = control.space, .msg_controllen = sizeof control.space};
    struct cmsghdr *header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(header), &inner[1], sizeof(int));
    CHECK(sendmsg(carrier[0], &message, 0));
    close(inner[1]);
    memset(&control, 0, sizeof control);
    struct msghdr received = {.msg_iov = &piece, .msg_iovlen = 1, .msg_control = control.space, .msg_controllen = sizeof control.space};
    CHECK(recvmsg(carrier[1], &received, MSG_CMSG_CLOEXEC));
    header = CMSG_FIRSTHDR(&received);
    if (!header || header->cmsg_type != SCM_RIGHTS) {
        printf("no descriptor came (msg_flags %#x)\n", received.msg_flags);
        return 1;
    }
    int passed;
    memcpy(&passed, CMSG_DATA(header), sizeof(int));
    CHECK(write(inner[0], "through", 7));
    char buffer[16] = "";
    CHECK(read(passed, buffer, sizeof buffer - 1));
    printf("passed: %s, close-on-exec %d\n", buffer, (fcntl(passed, F_GETFD) & FD_CLOEXEC) != 0);
    CHECK(pipe(pipe_ends));
    memcpy(CMSG_DATA(CMSG_FIRSTHDR(&message)), &pipe_ends[0], sizeof(int));
    int result = sendmsg(carrier[0], &message, 0);
    printf("a pipe: %d %s\n", result, name_of(errno));
    return 0;
}

static void on_signal(int signal) { (void)signal; }

static pthread_t receiver;

static void *interrupt_receiver(void *unused) {
    (void)unused;
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    pthread_kill(receiver, SIGUSR1);
    return NULL;
}

/* A blocking receive that nothing answers, ended by a signal another thread sends (its
 * handler without SA_RESTART): EINTR. */
static int interrupted(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in address = loopback(port);
    CHECK(connect(fd, (struct sockaddr *)&address, sizeof address));
    struct sigaction action = {.sa_handler = on_signal};
    sigaction(SIGUSR1, &action, NULL);
    receiver = pthread_self();
    pthread_t thread;
    pthread_create(&thread, NULL, interrupt_receiver, NULL);
    char buffer[8];
    int result = recv(fd, buffer, sizeof buffer, 0);
    printf("recv: %d %s\n", result, name_of(errno));
    pthread_join(thread, NULL);
    return 0;
}

/* Sockets until the user's descriptor limit says no. */
static int many(void) {
    int count = 0;
    for (;;) {
        int fd = socket(AF_INET, SOCK_DGRAM, 0);
        if (fd < 0) {
            printf("after %s: %s\n", count > 10 ? "many" : "few", name_of(errno));
            return 0;
        }
        count++;
        if (count > 900) {
            printf("no limit after %d\n", count);
            return 0;
        }
    }
}

/* Binds a privileged port. */
static int privileged(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in address = loopback(80);
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    int result = bind(fd, (struct sockaddr *)&address, sizeof address);
    printf("bind 80: %d %s\n", result, result ? name_of(errno) : "0");
    return 0;
}

/* The interfaces getifaddrs lists (through a NETLINK_ROUTE socket), loopback's IPv4 address
 * among them; a netlink family that is not passed on. */
static int interfaces(void) {
    struct ifaddrs *list;
    CHECK(getifaddrs(&list));
    for (struct ifaddrs *entry = list; entry; entry = entry->ifa_next) {
        char text[INET_ADDRSTRLEN];
        if (!strcmp(entry->ifa_name, "lo") && entry->ifa_addr && entry->ifa_addr->sa_family == AF_INET)
            printf("lo: %s\n", inet_ntop(AF_INET, &((struct sockaddr_in *)entry->ifa_addr)->sin_addr, text, sizeof text));
    }
    freeifaddrs(list);
    int audit = socket(AF_NETLINK, SOCK_RAW, NETLINK_AUDIT);
    printf("audit: %d %s\n", audit, audit < 0 ? name_of(errno) : "0");
    return 0;
}

static const char *ipv4_of(const struct sockaddr *address, char *text) {
    return inet_ntop(AF_INET, &((const struct sockaddr_in *)address)->sin_addr, text, INET_ADDRSTRLEN);
}

/* The interface queries Open MPI, PMIx and UCX make on a socket (SIOCGIFCONF and SIOCGIF*,
 * answered by the host), FIONBIO and FIONREAD, and requests no socket takes. */
static int ioctls(void) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(fd);
    char text[INET_ADDRSTRLEN];
    struct ifconf conf = {.ifc_len = 0, .ifc_buf = NULL};
    CHECK(ioctl(fd, SIOCGIFCONF, &conf));
    int needed = conf.ifc_len;
    struct ifreq list[64];
    conf.ifc_len = sizeof list;
    conf.ifc_req = list;
    CHECK(ioctl(fd, SIOCGIFCONF, &conf));
    for (int i = 0; i < conf.ifc_len / (int)sizeof(struct ifreq); i++)
        if (!strcmp(list[i].ifr_name, "lo")) printf("conf: lo %s\n", ipv4_of(&list[i].ifr_addr, text));
    printf("length query matches: %d\n", needed > 0 && needed == conf.ifc_len && needed % (int)sizeof(struct ifreq) == 0);
    conf.ifc_len = sizeof(struct ifreq) - 1;
    CHECK(ioctl(fd, SIOCGIFCONF, &conf));
    printf("short buffer: %d\n", conf.ifc_len);

    struct ifreq request = {0};
    strcpy(request.ifr_name, "lo");
    CHECK(ioctl(fd, SIOCGIFFLAGS, &request));
    printf("flags: up %d loopback %d\n", !!(request.ifr_flags & IFF_UP), !!(request.ifr_flags & IFF_LOOPBACK));
    CHECK(ioctl(fd, SIOCGIFINDEX, &request));
    printf("index: %d\n", request.ifr_ifindex);
    memset(request.ifr_name, 0, sizeof request.ifr_name);
    CHECK(ioctl(fd, SIOCGIFNAME, &request));
    printf("name of 1: %s\n", request.ifr_name);
    CHECK(ioctl(fd, SIOCGIFADDR, &request));
    printf("address: %s", ipv4_of(&request.ifr_addr, text));
    CHECK(ioctl(fd, SIOCGIFNETMASK, &request));
    printf(" netmask %s\n", ipv4_of(&request.ifr_netmask, text));
    CHECK(ioctl(fd, SIOCGIFMTU, &request));
    printf("mtu above 1000: %d\n", request.ifr_mtu > 1000);
    CHECK(ioctl(fd, SIOCGIFHWADDR, &request));
    printf("hardware: loopback %d\n", request.ifr_hwaddr.sa_family == ARPHRD_LOOPBACK);

    strcpy(request.ifr_name, "nosuch0");
    int result = ioctl(fd, SIOCGIFFLAGS, &request);
    printf("nosuch0: %d %s\n", result, result < 0 ? name_of(errno) : "0");
    /* A setter is never passed on; named for no interface, so that even a host that took it
     * (this program run outside an enclave, as root) changes nothing: ENODEV there. */
    result = ioctl(fd, SIOCSIFFLAGS, &request);
    printf("SIOCSIFFLAGS: %d %s\n", result, result < 0 ? name_of(errno) : "0");
    result = ioctl(fd, TCGETS, &request);
    printf("TCGETS: %d %s\n", result, result < 0 ? name_of(errno) : "0");
    result = ioctl(fd, SIOCGIFFLAGS, (void *)8);
    printf("bad pointer: %d %s\n", result, result < 0 ? name_of(errno) : "0");

    struct sockaddr_in address = loopback(0);
    socklen_t len = sizeof address;
    CHECK(bind(fd, (struct sockaddr *)&address, sizeof address));
    CHECK(getsockname(fd, (struct sockaddr *)&address, &len));
    int on = 1, off = 0, queued = -1;
    CHECK(ioctl(fd, FIONBIO, &on));
    char byte;
    result = recv(fd, &byte, 1, 0);
    printf("FIONBIO on: O_NONBLOCK %d, recv %d %s\n", !!(fcntl(fd, F_GETFL) & O_NONBLOCK), result, name_of(errno));
    CHECK(ioctl(fd, FIONBIO, &off));
    printf("FIONBIO off: O_NONBLOCK %d\n", !!(fcntl(fd, F_GETFL) & O_NONBLOCK));
    CHECK(sendto(fd, "hello", 5, 0, (struct sockaddr *)&address, sizeof address));
    CHECK(ioctl(fd, FIONREAD, &queued));
    printf("FIONREAD: %d\n", queued);
    close(fd);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    int port = argc > 2 ? atoi(argv[2]) : 0;
    if (!strcmp(mode, "tcp-client")) return tcp_client(port, atoi(argv[3]));
    if (!strcmp(mode, "tcp-server")) return tcp_server(argv[2]);
    if (!strcmp(mode, "udp")) return udp(port);
    if (!strcmp(mode, "unix")) return unix_sockets(argv[2]);
    if (!strcmp(mode, "readiness")) return readiness(port);
    if (!strcmp(mode, "eintr")) return interrupted(port);
    if (!strcmp(mode, "reset")) return reset(port);
    if (!strcmp(mode, "select")) return selecting(port);
    if (!strcmp(mode, "six")) return six(port);
    if (!strcmp(mode, "many")) return many();
    if (!strcmp(mode, "rights")) return rights();
    if (!strcmp(mode, "privileged")) return privileged();
    if (!strcmp(mode, "interfaces")) return interfaces();
    if (!strcmp(mode, "ioctls")) return ioctls();
    printf("unknown mode %s\n", mode);
    return 2;
}
