/* The small system calls libc start-up and ordinary programs make. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/times.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

int main(void) {
    struct utsname name;
    printf("uname %d %s %s\n", uname(&name), name.sysname, name.machine);
    printf("pid positive %d, tid == pid %d\n", getpid() > 0, (pid_t)syscall(SYS_gettid) == getpid());

    struct winsize size;
    int result = ioctl(1, TIOCGWINSZ, &size);
    printf("TIOCGWINSZ %d %s\n", result, strerror(errno));

    struct timespec first, second;
    clock_gettime(CLOCK_MONOTONIC, &first);
    for (volatile int i = 0; i < 1000000; i++)
        ;
    clock_gettime(CLOCK_MONOTONIC, &second);
    printf("monotonic advances %d\n", second.tv_sec > first.tv_sec || (second.tv_sec == first.tv_sec && second.tv_nsec > first.tv_nsec));
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    printf("realtime after 2020 %d\n", now.tv_sec > 1577836800);

    unsigned char random[64];
    printf("getrandom %zd\n", getrandom(random, sizeof random, 0));

    struct rlimit stack;
    result = getrlimit(RLIMIT_STACK, &stack);
    printf("getrlimit %d stack limit set %d\n", result, stack.rlim_cur > 0);

    mode_t old_mask = umask(077);
    printf("umask old %o, now %o\n", (unsigned)old_mask, (unsigned)umask(old_mask));
    struct rusage usage;
    printf("getrusage %d\n", getrusage(RUSAGE_SELF, &usage));
    struct tms tms;
    printf("times ok %d\n", times(&tms) != (clock_t)-1);
    struct sysinfo info;
    result = sysinfo(&info);
    printf("sysinfo %d, some ram %d\n", result, info.totalram * info.mem_unit > 0);

    errno = 0;
    long unknown = syscall(1000);
    printf("unknown syscall %ld %s\n", unknown, strerror(errno));

    errno = 0;
    result = write(1, (void *)16, 10);
    printf("bad pointer write %d %s\n", result, strerror(errno));
    errno = 0;
    result = write(42, "x", 1);
    printf("bad descriptor %d %s\n", result, strerror(errno));
    return 0;
}
