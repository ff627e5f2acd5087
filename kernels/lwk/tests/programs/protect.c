/* mprotect really removes write access: the store after it is SIGSEGV, status 139. */
#include <stdio.h>
#include <sys/mman.h>

int main(void) {
    char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    page[0] = 'a';
    printf("mprotect %d\n", mprotect(page, 4096, PROT_READ));
    printf("still readable %c\n", page[0]);
    fflush(stdout);
    page[0] = 'b';
    return 0;
}
