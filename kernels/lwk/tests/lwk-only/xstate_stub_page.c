/* The ring-3 XSAVE stub page (lwk.fpu=ring3) belongs to the kernel although user code can
   execute it: a process that jumps to a stub's ud2 gets SIGILL, one that runs the save stub
   on another thread slot's save-area address gets SIGSEGV (nothing is mapped there for it),
   and reading that address faults too; one that unmaps the stub page and every save area
   still takes a signal and forks (the kernel maps them again); the kernel carries on.
   Addresses: arch/fpu.rs (STUB_PAGE, USER_AREAS + slot * 4 KiB). */
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define STUB_PAGE 0x7ffffff00000UL
#define USER_AREAS 0x7fffffe00000UL
#define OTHER_SLOTS_AREA (USER_AREAS + 200 * 4096)

static void in_child(const char *what, void (*action)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        action();
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
        printf("%s: killed by signal %d\n", what, WTERMSIG(status));
    else
        printf("%s: exited %d\n", what, WEXITSTATUS(status));
}

static void jump_to_ud2(void) {
    ((void (*)(void))(STUB_PAGE + 4))();
}

static void save_elsewhere(void) {
    __asm__ volatile("mov %0, %%rdi\n\tmov $-1, %%eax\n\tmov $-1, %%edx\n\tcall *%1" ::"r"(OTHER_SLOTS_AREA), "r"(STUB_PAGE)
                     : "rdi", "rax", "rdx", "memory");
}

static void read_elsewhere(void) {
    printf("%lx\n", *(volatile unsigned long *)OTHER_SLOTS_AREA);
}

static volatile int handled;

static void on_usr1(int sig) {
    (void)sig;
    handled = 1;
}

static void exit_status(void) {
    _exit(0);
}

static void unmap_all(void) {
    munmap((void *)STUB_PAGE, 4096);
    munmap((void *)USER_AREAS, 256 * 4096);
    signal(SIGUSR1, on_usr1);
    raise(SIGUSR1);
    printf("handler ran %d\n", handled);
    in_child("its child", exit_status);
    fflush(stdout);
}

int main(void) {
    in_child("ud2 of the stub page", jump_to_ud2);
    in_child("save stub on another slot's area", save_elsewhere);
    in_child("read of another slot's area", read_elsewhere);
    in_child("after unmapping the stub page and the save areas", unmap_all);
    return 0;
}
