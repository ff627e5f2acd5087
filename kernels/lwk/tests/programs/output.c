/* A lot of output, through stdio buffering and straight write(2) calls. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    for (int i = 0; i < 2000; i++)
        printf("line %d of buffered output %s\n", i, i % 7 ? "" : "(seventh)");
    fflush(stdout);
    char block[10000];
    memset(block, 'x', sizeof block);
    block[sizeof block - 1] = '\n';
    write(1, block, sizeof block);
    fprintf(stderr, "to stderr\n");
    return 0;
}
