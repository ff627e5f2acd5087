/* A process that makes a page of its own code writable and changes it changes its own copy,
 * never the executable file: a fresh image of the same file (execve of /proc/self/exe) sees the
 * original bytes. (The LWK maps read-only pages of an executable from the archive itself, so it
 * must copy such a page before making it writable.) */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

__attribute__((noinline)) int marker(void) { return 42; }

int main(int argc, char **argv) {
    volatile unsigned char *code = (volatile unsigned char *)(uintptr_t)&marker;
    if (argc == 2 && strcmp(argv[1], "fresh") == 0) {
        printf("fresh image: marker's first byte %s\n", code[0] == 0xcc ? "changed" : "original");
        return 0;
    }
    void *page = (void *)((uintptr_t)code & ~(uintptr_t)4095);
    if (mprotect(page, 4096, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) {
        perror("mprotect");
        return 1;
    }
    code[0] = 0xcc;
    printf("this image: marker's first byte %s\n", code[0] == 0xcc ? "changed" : "unchanged");
    fflush(stdout);
    char *args[] = {argv[0], "fresh", NULL};
    execv("/proc/self/exe", args);
    perror("execv");
    return 1;
}
