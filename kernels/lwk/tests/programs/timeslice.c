/* The main thread spins until a thread it created sets a flag. When they share a CPU, only
   time slicing lets the other thread run. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

static atomic_int flag;

static void *set_flag(void *unused) {
    (void)unused;
    atomic_store(&flag, 1);
    return NULL;
}

int main(void) {
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&threads[i], NULL, set_flag, NULL);
    while (!atomic_load(&flag))
        ;
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    printf("flag seen\n");
    return 0;
}
