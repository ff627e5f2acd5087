/* pmi_probe: a rank's PMI-1 wire-up alone, as MPICH's Hydra serves it, without MPI: a static
 * program, so it runs in any enclave whatever the dynamic loader can do there. It connects as
 * MPICH's simple PMI client does (PMI_FD, else PMI_PORT=host:port), then init, get_my_kvsname,
 * put of its own key, barrier, get of the next rank's key, finalize, and checks the value it got
 * is the one that rank put. Rank 0 prints "pmi_probe: N ranks verified". A test probe for
 * scripts/mpich-test.sh (clowder run's PMI relay), not a PMI library. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int pmi_fd = -1;

static void fail(const char *what, const char *line)
{
    fprintf(stderr, "pmi_probe: %s%s%s\n", what, line ? ": " : "", line ? line : "");
    exit(1);
}

/* Sends one command line and reads the one-line answer into `reply`, which must be `expect`. */
static void ask(const char *command, const char *expect, char *reply, size_t size)
{
    size_t len = strlen(command), done = 0;
    while (done < len) {
        ssize_t n = write(pmi_fd, command + done, len - done);
        if (n <= 0) fail("cannot write to the PMI server", command);
        done += (size_t)n;
    }
    size_t at = 0;
    for (;;) {
        if (at + 1 >= size) fail("answer too long to", command);
        ssize_t n = read(pmi_fd, reply + at, 1);
        if (n <= 0) fail("the PMI server closed the connection after", command);
        if (reply[at] == '\n') break;
        at++;
    }
    reply[at] = 0;
    if (strncmp(reply, expect, strlen(expect)) != 0) fail("unexpected answer", reply);
}

/* The value of `key=` in `line`, copied into `out`. */
static void field(const char *line, const char *key, char *out, size_t size)
{
    char pattern[64];
    snprintf(pattern, sizeof pattern, "%s=", key);
    const char *at = strstr(line, pattern);
    if (!at) fail("no such field in the answer", line);
    at += strlen(pattern);
    size_t n = strcspn(at, " \n");
    if (n >= size) fail("field too long", line);
    memcpy(out, at, n);
    out[n] = 0;
}

static int connect_port(const char *host_port)
{
    char host[64];
    const char *colon = strrchr(host_port, ':');
    if (!colon || (size_t)(colon - host_port) >= sizeof host) fail("PMI_PORT is not host:port", host_port);
    memcpy(host, host_port, (size_t)(colon - host_port));
    host[colon - host_port] = 0;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) fail("PMI_PORT's host is no IPv4 address", host_port);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) fail("cannot connect to PMI_PORT", host_port);
    return fd;
}

int main(void)
{
    const char *fd = getenv("PMI_FD"), *port = getenv("PMI_PORT");
    const char *rank_s = getenv("PMI_RANK"), *size_s = getenv("PMI_SIZE");
    if (!rank_s || !size_s || (!fd && !port)) fail("not started by a PMI-1 launcher (PMI_RANK, PMI_SIZE, PMI_FD or PMI_PORT)", NULL);
    pmi_fd = fd ? atoi(fd) : connect_port(port);
    int rank = atoi(rank_s), size = atoi(size_s);
    if (size < 1 || rank < 0 || rank >= size) fail("bad PMI_RANK/PMI_SIZE", NULL);

    char reply[1024], kvs[256], command[1024], want[128], got[256];
    ask("cmd=init pmi_version=1 pmi_subversion=1\n", "cmd=response_to_init", reply, sizeof reply);
    field(reply, "rc", got, sizeof got);
    if (strcmp(got, "0") != 0) fail("init refused", reply);
    ask("cmd=get_my_kvsname\n", "cmd=my_kvsname", reply, sizeof reply);
    field(reply, "kvsname", kvs, sizeof kvs);
    snprintf(command, sizeof command, "cmd=put kvsname=%s key=probe%d value=from-%d-pid-%d\n", kvs, rank, rank, (int)getpid());
    ask(command, "cmd=put_result", reply, sizeof reply);
    ask("cmd=barrier_in\n", "cmd=barrier_out", reply, sizeof reply);
    int next = (rank + 1) % size;
    snprintf(command, sizeof command, "cmd=get kvsname=%s key=probe%d\n", kvs, next);
    ask(command, "cmd=get_result", reply, sizeof reply);
    field(reply, "value", got, sizeof got);
    snprintf(want, sizeof want, "from-%d-pid-", next);
    if (strncmp(got, want, strlen(want)) != 0) fail("wrong value for the next rank's key", reply);
    ask("cmd=barrier_in\n", "cmd=barrier_out", reply, sizeof reply);
    ask("cmd=finalize\n", "cmd=finalize_ack", reply, sizeof reply);
    if (rank == 0) printf("pmi_probe: %d ranks verified (%s)\n", size, fd ? "PMI_FD" : "PMI_PORT");
    return 0;
}
