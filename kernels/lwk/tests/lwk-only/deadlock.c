/* Two threads each wait for the other to finish: Linux would hang for ever; the LWK reports
   the dead-lock and ends the job with status 137 (as if killed by SIGKILL). */
#include <pthread.h>

static pthread_t main_thread;

static void *wait_for_main(void *unused) {
    (void)unused;
    pthread_join(main_thread, NULL);
    return NULL;
}

int main(void) {
    pthread_t other;
    main_thread = pthread_self();
    pthread_create(&other, NULL, wait_for_main, NULL);
    pthread_join(other, NULL);
    return 0;
}
