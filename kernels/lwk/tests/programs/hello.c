/* Arguments, environment and the exit status reach the job and come back. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        printf("argv[%d] = %s\n", i, argv[i]);
    const char *greeting = getenv("GREETING");
    printf("GREETING = %s\n", greeting ? greeting : "(unset)");
    return 3;
}
