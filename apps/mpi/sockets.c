/*
 * sockets: whether this system gives a job what an Open MPI rank needs at wire-up: a Unix
 * stream socket (PMIx), TCP sockets, and a network interface with an address other than
 * loopback and link-local in one of the lists Open MPI reads: SIOCGIFCONF (its posix_ipv4
 * component, IPv4) or /proc/net/if_inet6 (its linux_ipv6 component). Prints one line, e.g.
 *
 *   sockets: unix ok, tcp ok, tcp6 ok, SIOCGIFCONF 1, if_inet6 1
 *
 * and exits 0 if a rank can start, 1 if not. mpi-test.sh runs it in an enclave to tell "enclave
 * ranks cannot start here yet" from a failure.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

static int try(int domain, const char *name) {
    int fd = socket(domain, SOCK_STREAM, 0);
    printf("%s %s, ", name, fd >= 0 ? "ok" : strerror(errno));
    if (fd >= 0) close(fd);
    return fd >= 0;
}

/* Non-loopback IPv4 interfaces by SIOCGIFCONF, or -1 (errno set). */
static int ipv4_interfaces(void) {
    struct ifreq requests[64];
    struct ifconf conf = {.ifc_len = sizeof requests, .ifc_req = requests};
    int fd = socket(AF_INET, SOCK_DGRAM, 0), found = 0;
    if (fd < 0 || ioctl(fd, SIOCGIFCONF, &conf) != 0) {
        int error = errno;
        if (fd >= 0) close(fd);
        errno = error;
        return -1;
    }
    for (size_t i = 0; i < conf.ifc_len / sizeof requests[0]; i++) {
        struct sockaddr_in *address = (struct sockaddr_in *)&requests[i].ifr_addr;
        found += address->sin_family == AF_INET && (ntohl(address->sin_addr.s_addr) >> 24) != 127;
    }
    close(fd);
    return found;
}

/* IPv6 addresses of global scope (scope field 00) in /proc/net/if_inet6, or -1 (errno set). */
static int ipv6_interfaces(void) {
    FILE *list = fopen("/proc/net/if_inet6", "r");
    if (!list) return -1;
    char address[33], name[IF_NAMESIZE + 1];
    unsigned index, prefix, scope, flags;
    int found = 0;
    while (fscanf(list, "%32s %x %x %x %x %16s", address, &index, &prefix, &scope, &flags, name) == 6)
        found += scope == 0;
    fclose(list);
    return found;
}

static int report(const char *name, int count, int last) {
    if (count < 0)
        printf("%s %s%s", name, strerror(errno), last ? "\n" : ", ");
    else
        printf("%s %d%s", name, count, last ? "\n" : ", ");
    return count > 0;
}

int main(void) {
    printf("sockets: ");
    int unix_ok = try(AF_UNIX, "unix"), tcp_ok = try(AF_INET, "tcp"), tcp6_ok = try(AF_INET6, "tcp6");
    int v4 = report("SIOCGIFCONF", ipv4_interfaces(), 0);
    int v6 = report("if_inet6", ipv6_interfaces(), 1);
    return unix_ok && ((tcp_ok && v4) || (tcp6_ok && v6)) ? 0 : 1;
}
