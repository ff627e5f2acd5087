/* The calls the LWK answers in ring 3 (kernels/lwk/src/arch/fastcall.rs) give exactly the
 * kernel path's answers. Each call is made twice: through SYSCALL (the fast path where the
 * kernel offers one) and through the kernel path. In the LWK on a host where SYSCALL stays in
 * ring 3 (PVM) the kernel path is the ud2 at the top of the fast-call page, entered as SYSCALL
 * would (RCX the return address); elsewhere (the host run, QEMU, VMX) both are SYSCALL, and
 * the program must print the same. Timed answers are compared in order: kernel, fast, kernel
 * must not go backwards. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define LWK_VDSO 0x7ffffffed000ul
#define KERNEL_PATH 0x7ffffffff000ul
#define FAST_PAGES 0x7fffffffd000ul

static int alternate; /* the kernel path has its own entry here */
static int failures;

static long fast(long number, long a, long b, long c)
{
    long result;
    __asm__ volatile("syscall" : "=a"(result) : "a"(number), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return result;
}

static long kernel(long number, long a, long b, long c)
{
    if (!alternate)
        return fast(number, a, b, c);
    long result;
    /* As SYSCALL leaves it: RCX the return address, R11 the flags. */
    __asm__ volatile("lea 1f(%%rip), %%rcx\n\t"
                     "mov $0x202, %%r11\n\t"
                     "jmp *%[entry]\n"
                     "1:"
                     : "=a"(result)
                     : "a"(number), "D"(a), "S"(b), "d"(c), [entry] "r"(KERNEL_PATH)
                     : "rcx", "r11", "memory", "cc");
    return result;
}

static void check(int ok, const char *what)
{
    if (!ok) {
        printf("FAIL %s\n", what);
        failures++;
    }
}

static sigjmp_buf probe_jump;
static void probe_fault(int signal)
{
    siglongjmp(probe_jump, signal);
}

/* In the LWK, is the kernel path's ud2 mapped (only where SYSCALL stays in ring 3)? */
static void find_kernel_path(void)
{
    if (getauxval(AT_SYSINFO_EHDR) != LWK_VDSO)
        return;
    struct sigaction action = { .sa_handler = probe_fault }, old_segv, old_ill;
    sigaction(SIGSEGV, &action, &old_segv);
    sigaction(SIGILL, &action, &old_ill);
    if (sigsetjmp(probe_jump, 1) == 0) {
        alternate = 1;
        if (kernel(SYS_getpid, 0, 0, 0) != getpid())
            alternate = 0;
    } else {
        alternate = 0;
    }
    sigaction(SIGSEGV, &old_segv, 0);
    sigaction(SIGILL, &old_ill, 0);
}

static void identity(const char *who)
{
    static const long calls[] = { SYS_getpid, SYS_gettid, SYS_getppid, SYS_getuid, SYS_geteuid, SYS_getgid, SYS_getegid };
    for (unsigned i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s: call %ld", who, calls[i]);
        check(fast(calls[i], 0, 0, 0) == kernel(calls[i], 0, 0, 0), what);
    }
    unsigned fast_cpu = 99, fast_node = 99, kernel_cpu = 98, kernel_node = 98;
    check(fast(SYS_getcpu, (long)&fast_cpu, (long)&fast_node, 0) == 0 && kernel(SYS_getcpu, (long)&kernel_cpu, (long)&kernel_node, 0) == 0
              && fast_cpu == kernel_cpu && fast_node == kernel_node,
          "getcpu");
    /* getresuid, getresgid: all three ids; with a bad second pointer the first is written
       before EFAULT, on both paths as on Linux. */
    static const long resid_calls[] = { SYS_getresuid, SYS_getresgid };
    for (unsigned i = 0; i < 2; i++) {
        unsigned f[3] = { 7, 7, 7 }, k[3] = { 8, 8, 8 };
        char what[64];
        snprintf(what, sizeof what, "%s: call %ld", who, resid_calls[i]);
        check(fast(resid_calls[i], (long)&f[0], (long)&f[1], (long)&f[2]) == 0 && kernel(resid_calls[i], (long)&k[0], (long)&k[1], (long)&k[2]) == 0
                  && memcmp(f, k, sizeof f) == 0,
              what);
        unsigned fast_first = 7, kernel_first = 8;
        long bad = (long)0xffff800000000000ul;
        snprintf(what, sizeof what, "%s: call %ld with a bad second pointer", who, resid_calls[i]);
        check(fast(resid_calls[i], (long)&fast_first, bad, (long)&f[2]) == -14 && kernel(resid_calls[i], (long)&kernel_first, bad, (long)&k[2]) == -14
                  && fast_first == kernel_first,
              what);
    }
    printf("%s: identity and getcpu agree\n", who);
}

static void *thread_identity(void *unused)
{
    (void)unused;
    identity("thread");
    return 0;
}

static uint64_t nanoseconds(const struct timespec *time)
{
    return (uint64_t)time->tv_sec * 1000000000u + (uint64_t)time->tv_nsec;
}

static void clocks(void)
{
    /* Every id the kernel knows, and ones it refuses (EINVAL on both paths). */
    static const long ids[] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 100, -1, -6, 0x7fffffff, 0x100000001 };
    for (unsigned i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        struct timespec before = { 0 }, now = { 0 }, after = { 0 }, fast_res = { 5, 5 }, kernel_res = { 6, 6 };
        long k1 = kernel(SYS_clock_gettime, ids[i], (long)&before, 0);
        long f = fast(SYS_clock_gettime, ids[i], (long)&now, 0);
        long k2 = kernel(SYS_clock_gettime, ids[i], (long)&after, 0);
        char what[64];
        snprintf(what, sizeof what, "clock_gettime(%ld): %ld %ld %ld", ids[i], k1, f, k2);
        check(k1 == f && f == k2 && (f != 0 || (nanoseconds(&before) <= nanoseconds(&now) && nanoseconds(&now) <= nanoseconds(&after))), what);
        long fr = fast(SYS_clock_getres, ids[i], (long)&fast_res, 0);
        long kr = kernel(SYS_clock_getres, ids[i], (long)&kernel_res, 0);
        snprintf(what, sizeof what, "clock_getres(%ld): %ld %ld", ids[i], fr, kr);
        check(fr == kr && (fr != 0 || memcmp(&fast_res, &kernel_res, sizeof fast_res) == 0), what);
        check(fast(SYS_clock_getres, ids[i], 0, 0) == kernel(SYS_clock_getres, ids[i], 0, 0), "clock_getres without a buffer");
    }
    printf("clock_gettime, clock_getres: %u ids agree\n", (unsigned)(sizeof ids / sizeof ids[0]));
}

static uint64_t usage_us(const long *usage)
{
    return (uint64_t)(usage[0] + usage[2]) * 1000000u + (uint64_t)(usage[1] + usage[3]);
}

static void usage(void)
{
    static const long who[] = { 0, 1, -1, 2, -2 }; /* SELF, THREAD, CHILDREN, bad, bad */
    for (unsigned i = 0; i < sizeof who / sizeof who[0]; i++) {
        long before[18], now[18], after[18];
        memset(before, 1, sizeof before), memset(now, 2, sizeof now), memset(after, 3, sizeof after);
        long k1 = kernel(SYS_getrusage, who[i], (long)before, 0);
        long f = fast(SYS_getrusage, who[i], (long)now, 0);
        long k2 = kernel(SYS_getrusage, who[i], (long)after, 0);
        char what[64];
        snprintf(what, sizeof what, "getrusage(%ld): %ld %ld %ld", who[i], k1, f, k2);
        check(k1 == f && f == k2 && (f != 0 || (usage_us(before) <= usage_us(now) && usage_us(now) <= usage_us(after))), what);
        /* The other fields (page faults, context switches...) move on the host between
           calls; in the LWK they are the kernel's exactly. */
        if (alternate && f == 0)
            check(memcmp(&now[4], &after[4], sizeof now - 4 * sizeof now[0]) == 0, "getrusage's other fields");
    }
    struct { long user, system, child_user, child_system; } tb[3];
    memset(tb, 7, sizeof tb);
    long k1 = kernel(SYS_times, (long)&tb[0], 0, 0), f = fast(SYS_times, (long)&tb[1], 0, 0), k2 = kernel(SYS_times, (long)&tb[2], 0, 0);
    check(k1 <= f && f <= k2, "times' clock");
    check(tb[0].user + tb[0].system <= tb[1].user + tb[1].system && tb[1].user + tb[1].system <= tb[2].user + tb[2].system, "times' process time");
    check(tb[1].child_user == tb[2].child_user && tb[1].child_system == tb[2].child_system, "times' children's time");
    k1 = kernel(SYS_times, 0, 0, 0), f = fast(SYS_times, 0, 0, 0), k2 = kernel(SYS_times, 0, 0, 0);
    check(k1 <= f && f <= k2, "times without a buffer");
    printf("getrusage, times agree\n");
}

static void names(void)
{
    char fast_name[390], kernel_name[390];
    memset(fast_name, 1, sizeof fast_name), memset(kernel_name, 2, sizeof kernel_name);
    check(fast(SYS_uname, (long)fast_name, 0, 0) == 0 && kernel(SYS_uname, (long)kernel_name, 0, 0) == 0, "uname's result");
    check(memcmp(fast_name, kernel_name, sizeof fast_name) == 0, "uname's record");
    printf("uname agrees\n");
}

/* Bad pointers: EFAULT from both paths, as Linux gives. */
static void bad_pointers(void)
{
    static const char read_only[4096] __attribute__((aligned(4096))) = { 1 };
    char *pages = mmap(0, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(pages + 4096, 4096);
    /* NULL is no error for clock_getres, times and getcpu: the same answer is enough. */
    long bad[] = { 0, 1, (long)read_only, (long)(pages + 4096 - 2), (long)0xffff800000000000ul, -8 };
    unsigned cases = 0;
    for (unsigned i = 0; i < sizeof bad / sizeof bad[0] + (alternate ? 3 : 0); i++) {
        /* In the LWK also the fast-call pages themselves (never the job's memory). */
        long pointer = i < sizeof bad / sizeof bad[0] ? bad[i] : (long)(FAST_PAGES + (i - sizeof bad / sizeof bad[0]) * 4096 + 4088);
        struct { long number, a, b; } calls[] = {
            { SYS_clock_gettime, 1, pointer }, { SYS_clock_gettime, 0, pointer }, { SYS_clock_getres, 2, pointer },
            { SYS_getrusage, 0, pointer }, { SYS_getrusage, 1, pointer }, { SYS_times, pointer, 0 },
            { SYS_getcpu, pointer, 0 }, { SYS_getcpu, 0, pointer }, { SYS_uname, pointer, 0 },
            { SYS_getresuid, pointer, 0 }, { SYS_getresgid, pointer, 0 },
        };
        for (unsigned j = 0; j < sizeof calls / sizeof calls[0]; j++, cases++) {
            long f = fast(calls[j].number, calls[j].a, calls[j].b, 0);
            long k = kernel(calls[j].number, calls[j].a, calls[j].b, 0);
            char what[96];
            snprintf(what, sizeof what, "call %ld with %#lx: fast %ld, kernel %ld", calls[j].number, (unsigned long)pointer, f, k);
            /* The scratch page is the job's own: the kernel may write there. */
            int clock = calls[j].number == SYS_times && f >= 0 && k >= 0; /* ticks move on */
            check((f == k || clock) && (pointer == 0 || pointer >= (long)FAST_PAGES || f == -14), what);
        }
    }
    munmap(pages, 4096);
    printf("bad pointers: EFAULT from both paths\n");
}

/* Only RAX, RCX and R11 change, as with any system call; the flags come back as they were
 * (carry and direction set here). */
static void registers_kept(void)
{
    static struct timespec time;
    static long usage_buffer[18], tms_buffer[4];
    static char name[390];
    static unsigned cpu, node;
    struct { long number, a, b; } calls[] = {
        { SYS_getpid, 0, 0 }, { SYS_clock_gettime, 1, (long)&time }, { SYS_getrusage, 0, (long)usage_buffer },
        { SYS_times, (long)tms_buffer, 0 }, { SYS_uname, (long)name, 0 }, { SYS_getcpu, (long)&cpu, (long)&node },
        { SYS_sched_yield, 0, 0 }, { SYS_clock_gettime, 12, (long)&time },
    };
    for (unsigned i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        register long r10 __asm__("r10") = 0x1010, r8 __asm__("r8") = 0x0808, r9 __asm__("r9") = 0x0909;
        long rdi = calls[i].a, rsi = calls[i].b, rdx = 0x0d0d, rax = calls[i].number, flags;
        __asm__ volatile("stc\n\tstd\n\tsyscall\n\tpushfq\n\tpopq %[flags]\n\tcld"
                         : "+a"(rax), "+D"(rdi), "+S"(rsi), "+d"(rdx), "+r"(r10), "+r"(r8), "+r"(r9), [flags] "=r"(flags)
                         :
                         : "rcx", "r11", "memory", "cc");
        /* (Register variables hold only up to the next call.) */
        int kept = rdi == calls[i].a && rsi == calls[i].b && rdx == 0x0d0d && r10 == 0x1010 && r8 == 0x0808 && r9 == 0x0909;
        char what[64];
        snprintf(what, sizeof what, "registers kept by call %ld", calls[i].number);
        check(kept, what);
        snprintf(what, sizeof what, "carry and direction kept by call %ld", calls[i].number);
        check((flags & 0x401) == 0x401, what);
    }
    printf("registers and flags kept\n");
}

/* The process's CPU time never goes back, across yields to another thread on this CPU. */
static volatile int spinning = 1;
static cpu_set_t first_cpu;
static void *yielder(void *unused)
{
    (void)unused;
    sched_setaffinity(0, sizeof first_cpu, &first_cpu);
    while (spinning)
        sched_yield();
    return 0;
}

static void cpu_time_across_yields(void)
{
    CPU_ZERO(&first_cpu);
    CPU_SET(0, &first_cpu);
    sched_setaffinity(0, sizeof first_cpu, &first_cpu);
    pthread_t thread;
    pthread_create(&thread, 0, yielder, 0);
    uint64_t last = 0;
    int backwards = 0;
    for (int i = 0; i < 300; i++) {
        struct timespec process, thread_time;
        fast(SYS_clock_gettime, CLOCK_PROCESS_CPUTIME_ID, (long)&process, 0);
        fast(SYS_clock_gettime, CLOCK_THREAD_CPUTIME_ID, (long)&thread_time, 0);
        backwards += nanoseconds(&process) < last;
        last = nanoseconds(&process);
        check(fast(SYS_sched_yield, 0, 0, 0) == 0, "sched_yield");
    }
    spinning = 0;
    pthread_join(thread, 0);
    check(backwards == 0, "CPU time went back across yields");
    /* Alone on the CPU: sched_yield answers at once, the same from both paths. */
    check(fast(SYS_sched_yield, 0, 0, 0) == 0 && kernel(SYS_sched_yield, 0, 0, 0) == 0, "sched_yield alone");
    printf("CPU time monotonic across yields\n");
}

/* A thread that only makes fast calls is still preempted (the sender shares its CPU and
 * sends only once it loops) and gets the signal sent to it. */
static volatile sig_atomic_t signalled;
static volatile int looping;
static void on_signal(int signal)
{
    (void)signal;
    signalled = 1;
}

static void *send_signal(void *target)
{
    sched_setaffinity(0, sizeof first_cpu, &first_cpu);
    while (!looping)
        ;
    pthread_kill(*(pthread_t *)target, SIGUSR1);
    return 0;
}

static void signal_while_fast(void)
{
    struct sigaction action = { .sa_handler = on_signal };
    sigaction(SIGUSR1, &action, 0);
    pthread_t self = pthread_self(), sender;
    pthread_create(&sender, 0, send_signal, &self);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start); /* the vDSO: no system call */
    looping = 1;
    do {
        fast(SYS_getpid, 0, 0, 0);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (!signalled && now.tv_sec - start.tv_sec < 20);
    check(signalled, "signal delivered to a thread making only fast calls, within 20 s");
    pthread_join(sender, 0);
    printf("a signal reaches a thread making fast calls\n");
}

int main(void)
{
    setvbuf(stdout, 0, _IOLBF, 0); /* a hang shows where it is */
    find_kernel_path();
    identity("process");
    pthread_t thread;
    pthread_create(&thread, 0, thread_identity, 0);
    pthread_join(thread, 0);
    fflush(stdout);
    /* A child, and its child, which is orphaned: both paths must see its new parent. */
    int pipe_ends[2];
    pipe(pipe_ends);
    pid_t child = fork();
    if (child == 0) {
        identity("child");
        fflush(stdout);
        pid_t parent = getpid();
        if (fork() == 0) {
            for (int i = 0; i < 100000 && kernel(SYS_getppid, 0, 0, 0) == parent; i++)
                sched_yield();
            char agree = kernel(SYS_getppid, 0, 0, 0) != parent && fast(SYS_getppid, 0, 0, 0) == kernel(SYS_getppid, 0, 0, 0);
            write(pipe_ends[1], &agree, 1);
            _exit(0);
        }
        _exit(0);
    }
    close(pipe_ends[1]);
    int status;
    waitpid(child, &status, 0);
    char agree = 0;
    check(read(pipe_ends[0], &agree, 1) == 1 && agree, "an orphan's parent");
    printf("orphan: getppid agrees\n");
    clocks();
    usage();
    names();
    bad_pointers();
    registers_kept();
    cpu_time_across_yields();
    signal_while_fast();
    printf("%d failures\n", failures);
    return failures != 0;
}
