/* Synchronous faults caught by handlers: siginfo of SIGSEGV (unmapped and write-protected),
   SIGFPE and SIGILL, each left with siglongjmp; a handler on the alternate stack. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

static sigjmp_buf recover;
static siginfo_t seen;
static int on_alt_stack, stack_flags_in_handler;
static char *alt_base;
static size_t alt_size = 64 * 1024;
static uintptr_t saved_rip, saved_rsp_nonzero;

static void on_fault(int sig, siginfo_t *info, void *context) {
    (void)sig;
    ucontext_t *uc = context;
    seen = *info;
    saved_rip = uc->uc_mcontext.gregs[REG_RIP];
    saved_rsp_nonzero = uc->uc_mcontext.gregs[REG_RSP] != 0;
    char here;
    on_alt_stack = &here >= alt_base && &here < alt_base + alt_size;
    stack_t current;
    sigaltstack(NULL, &current);
    stack_flags_in_handler = current.ss_flags;
    siglongjmp(recover, 1);
}

static void install(int sig, int flags) {
    struct sigaction action = {0};
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | flags;
    sigemptyset(&action.sa_mask);
    sigaction(sig, &action, NULL);
}

static volatile int zero = 0;

int main(void) {
    install(SIGSEGV, 0);
    if (sigsetjmp(recover, 1) == 0) {
        *(volatile int *)16 = 1;
        puts("no fault?");
    }
    printf("unmapped: signo %d code %d (SEGV_MAPERR %d) addr %p alt %d rsp saved %d\n", seen.si_signo, seen.si_code,
           SEGV_MAPERR, seen.si_addr, on_alt_stack, (int)saved_rsp_nonzero);

    char *page = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (sigsetjmp(recover, 1) == 0) {
        page[100] = 1;
        puts("no fault?");
    }
    printf("read-only: signo %d code %d (SEGV_ACCERR %d) addr is page+100 %d\n", seen.si_signo, seen.si_code, SEGV_ACCERR,
           seen.si_addr == page + 100);

    install(SIGFPE, 0);
    if (sigsetjmp(recover, 1) == 0) {
        printf("%d\n", 7 / zero);
    }
    printf("divide: signo %d code %d (FPE_INTDIV %d) addr is rip %d\n", seen.si_signo, seen.si_code, FPE_INTDIV,
           (uintptr_t)seen.si_addr == saved_rip);

    install(SIGILL, 0);
    if (sigsetjmp(recover, 1) == 0) {
        __builtin_trap();
    }
    printf("illegal: signo %d code %d (ILL_ILLOPN %d) addr is rip %d\n", seen.si_signo, seen.si_code, ILL_ILLOPN,
           (uintptr_t)seen.si_addr == saved_rip);

    /* The same fault, handled on an alternate stack. */
    alt_base = malloc(alt_size);
    stack_t alt = {.ss_sp = alt_base, .ss_size = alt_size, .ss_flags = 0};
    if (sigaltstack(&alt, NULL) != 0) return 10;
    stack_t too_small = {.ss_sp = alt_base, .ss_size = 100, .ss_flags = 0};
    printf("too small an alternate stack refused: %d\n", sigaltstack(&too_small, NULL) != 0);
    install(SIGSEGV, SA_ONSTACK);
    if (sigsetjmp(recover, 1) == 0) {
        *(volatile int *)16 = 1;
    }
    printf("on the alternate stack: %d, flags in handler %d (SS_ONSTACK %d)\n", on_alt_stack, stack_flags_in_handler, SS_ONSTACK);
    stack_t after;
    sigaltstack(NULL, &after);
    printf("after: flags %d, size %zu\n", after.ss_flags, after.ss_size);

    /* Blocked faults cannot be caught: the job dies of SIGSEGV (status 139). */
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGSEGV);
    sigprocmask(SIG_BLOCK, &block, NULL);
    fflush(stdout);
    *(volatile int *)16 = 1;
    return 0;
}
