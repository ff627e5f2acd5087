/* abort(): SIGABRT's default action, status 134, even when a handler returns. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static void on_abort(int sig) {
    printf("handler for %d ran\n", sig);
    fflush(stdout);
}

int main(void) {
    signal(SIGABRT, on_abort);
    puts("aborting");
    fflush(stdout);
    abort();
}
