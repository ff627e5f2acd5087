/* Integer division by zero: SIGFPE, status 136. */
#include <stdio.h>

int main(void) {
    volatile int zero = 0;
    printf("%d\n", 10 / zero);
    return 0;
}
