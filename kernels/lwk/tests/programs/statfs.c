/* statfs and fstatfs where the job's answer equals the host's whatever the file systems: a
   pipe's file system (pipefs), a missing path, a bad pointer, a closed descriptor. (Host paths
   are compared with the host's answer in node/cli-tests/tests/statfs.rs.) */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

static void say(const char *what, int result) {
    printf("%s: %d%s%s\n", what, result, result < 0 ? " " : "", result < 0 ? strerror(errno) : "");
}

int main(void) {
    struct statfs fs;
    int pipe_ends[2];
    if (pipe(pipe_ends) < 0)
        return 1;
    memset(&fs, 0, sizeof fs);
    say("fstatfs pipe", fstatfs(pipe_ends[0], &fs));
    printf("pipe: type %#lx, block size %ld\n", (long)fs.f_type, (long)fs.f_bsize);
    say("statfs missing", statfs("no/such/file", &fs));
    /* The raw call: libcs may copy the answer themselves and fault in user mode. */
    say("statfs bad pointer", (int)syscall(SYS_statfs, "/", 8));
    close(pipe_ends[1]);
    say("fstatfs closed", fstatfs(pipe_ends[1], &fs));
    return 0;
}
