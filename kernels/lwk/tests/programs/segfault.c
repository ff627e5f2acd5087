/* A store through a null pointer: SIGSEGV, status 139. */
#include <stdio.h>

int main(void) {
    printf("before the fault\n");
    fflush(stdout);
    *(volatile int *)0 = 1;
    printf("after the fault\n");
    return 0;
}
