/* munmap really removes the pages: reading them afterwards is SIGSEGV, status 139. */
#include <stdio.h>
#include <sys/mman.h>

int main(void) {
    volatile char *pages = mmap(NULL, 8 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pages[5 << 20] = 1;
    printf("munmap %d\n", munmap((void *)pages, 8 << 20));
    fflush(stdout);
    return pages[5 << 20];
}
