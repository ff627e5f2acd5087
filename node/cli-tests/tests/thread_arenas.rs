//! glibc's per-thread malloc arenas in an LWK job (issue 25 point 2: MPI ranks sharing an
//! enclave, each with a heap of its own size). Every mapping of an LWK job takes its memory at
//! once from the job's heap, so glibc's arenas (64 MiB reserved per allocating thread) ate a
//! rank's whole heap and `mpirun -n 2 clowder run --enclave a` never finished. The LWK holds
//! glibc to one arena unless the job names its own `MALLOC_ARENA_MAX`: four threads that
//! allocate at once share one arena and leave a 300 MiB malloc room in a 512 MiB heap; with
//! `MALLOC_ARENA_MAX=8` they make four more and it fails (the job's own value wins). Needs
//! /dev/kvm, the LWK image, clowder-vmm and gcc; skipped, with the reason, otherwise.

use std::process::{Command, Output};

use clowderd::enclave::Liveness;
use support::{run_clowder, run_clowder_ok, skipped_without, test_daemon, text};

mod support;

/// Four threads each malloc a little and free it once all have (so that all four hold an arena
/// at once, as a rank's threads do); then the main thread lists the arenas (`Arena N:` lines of
/// `malloc_stats` on stderr), mallocs and touches 300 MiB and says whether it could. The
/// threads make their first malloc in turn: glibc reserves 128 MiB for a new arena before it
/// trims it to 64, so four at once could find the 512 MiB heap full and share an arena.
const ARENAS: &str = r#"#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static pthread_barrier_t all_allocated;
static char *volatile kept[4];
static int turn;
static void *allocate(void *index) {
    int me = (int)(long)index;
    while (__atomic_load_n(&turn, __ATOMIC_ACQUIRE) != me) sched_yield();
    char *small = kept[me] = malloc(64);
    if (small) memset(small, 1, 64);
    __atomic_store_n(&turn, me + 1, __ATOMIC_RELEASE);
    pthread_barrier_wait(&all_allocated);
    free(small);
    return NULL;
}
int main(void) {
    pthread_t threads[4];
    pthread_barrier_init(&all_allocated, NULL, 4);
    for (int i = 0; i < 4; i++)
        if (pthread_create(&threads[i], NULL, allocate, (void *)(long)i) != 0) return 10;
    for (int i = 0; i < 4; i++) pthread_join(threads[i], NULL);
    malloc_stats(); /* "Arena N:" on stderr for each arena */
    size_t big = (size_t)300 << 20;
    char *block = malloc(big);
    if (!block) {
        printf("malloc of 300 MiB failed\n");
        return 1;
    }
    memset(block, 1, big);
    printf("300 MiB allocated\n");
    return 0;
}
"#;

/// How many arenas the job's `malloc_stats` listed.
fn arenas(output: &Output) -> usize {
    text(&output.stderr).lines().filter(|line| line.starts_with("Arena ")).count()
}

#[test]
fn threads_that_allocate_leave_the_heap_to_the_job() {
    if skipped_without("gcc", "to build a glibc program with threads") {
        return;
    }
    let (dir, socket) = test_daemon("clowder-thread-arenas", Liveness::default());
    std::fs::write(dir.0.join("arenas.c"), ARENAS).unwrap();
    let built = Command::new("gcc").args(["-O2", "-pthread", "-o", "arenas", "arenas.c"]).current_dir(&dir.0).status().unwrap();
    assert!(built.success(), "gcc failed for arenas.c");
    run_clowder_ok(&socket, &["enclave", "create", "--name", "a", "--cores", "0,1", "--mem", "1G"], &dir.0);

    let one_arena = run_clowder(&socket, &["run", "--enclave", "a", "--heap", "512M", "./arenas"], &dir.0);
    assert_eq!(arenas(&one_arena), 1, "stderr: {}", text(&one_arena.stderr));
    assert_eq!(text(&one_arena.stdout), "300 MiB allocated\n", "stderr: {}", text(&one_arena.stderr));
    assert!(one_arena.status.success(), "{:?}", one_arena.status);

    let own_value = run_clowder(&socket, &["run", "--enclave", "a", "--heap", "512M", "--env", "MALLOC_ARENA_MAX=8", "./arenas"], &dir.0);
    assert_eq!(arenas(&own_value), 5, "stderr: {}", text(&own_value.stderr));
    assert_eq!(text(&own_value.stdout), "malloc of 300 MiB failed\n", "stderr: {}", text(&own_value.stderr));
    assert_eq!(own_value.status.code(), Some(1));
}
