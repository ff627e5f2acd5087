/* fileio: the forwarded-file rows of lwk-bench. Run in DIR (a host directory), the same static
 * binary on the host and in an LWK enclave: open+close and stat of a file there (mean over a
 * few hundred calls), then sequential write and read of a TOTAL_MIB file at 4 KiB, 64 KiB and
 * 8 MiB requests (MB/s; the read follows the write, so it comes from the host's page cache).
 * Prints one line per figure: "fileio: <what> <number> <unit>". */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void fail(const char *what) {
    perror(what);
    exit(1);
}

int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 200;
    long total = (argc > 2 ? atol(argv[2]) : 64) << 20;
    const long sizes[] = {4096, 65536, 8 << 20};
    char *buffer = malloc(8 << 20);
    if (!buffer) fail("malloc");
    memset(buffer, 'x', 8 << 20);
    int fd = open("fileio.data", O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || close(fd) != 0) fail("create fileio.data");

    double start = now();
    for (int i = 0; i < calls; i++) {
        fd = open("fileio.data", O_RDONLY);
        if (fd < 0 || close(fd) != 0) fail("open+close");
    }
    printf("fileio: open+close %.1f us\n", (now() - start) / calls * 1e6);
    struct stat st;
    start = now();
    for (int i = 0; i < calls; i++)
        if (stat("fileio.data", &st) != 0) fail("stat");
    printf("fileio: stat %.1f us\n", (now() - start) / calls * 1e6);

    for (int s = 0; s < 3; s++) {
        long size = sizes[s];
        /* Small requests move less in all, so that each row takes about as long. */
        long bytes = size == 4096 ? total / 8 : total;
        fd = open("fileio.data", O_WRONLY | O_TRUNC);
        if (fd < 0) fail("open for writing");
        start = now();
        for (long done = 0; done < bytes; done += size)
            if (write(fd, buffer, size) != size) fail("write");
        double seconds = now() - start;
        close(fd);
        printf("fileio: write %ld KiB %.0f MB/s\n", size >> 10, bytes / seconds / 1e6);
        fd = open("fileio.data", O_RDONLY);
        if (fd < 0) fail("open for reading");
        start = now();
        for (long done = 0; done < bytes; done += size)
            if (read(fd, buffer, size) != size) fail("read");
        seconds = now() - start;
        close(fd);
        printf("fileio: read %ld KiB %.0f MB/s\n", size >> 10, bytes / seconds / 1e6);
    }
    unlink("fileio.data");
    return 0;
}
