/* The job's files: reading, seeking and stat'ing inputs, listing a directory, and the
   errors for missing paths. Runs from a directory holding tests/programs/files. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int compare(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void) {
    FILE *input = fopen("files/input.txt", "r");
    if (!input)
        return 1;
    char line[128];
    int lines = 0;
    while (fgets(line, sizeof line, input))
        printf("line %d: %s", ++lines, line);
    fclose(input);

    int descriptor = open("files/input.txt", O_RDONLY);
    struct stat status;
    fstat(descriptor, &status);
    printf("size %lld, regular %d\n", (long long)status.st_size, S_ISREG(status.st_mode));
    char word[7] = {0};
    lseek(descriptor, -17, SEEK_END);
    read(descriptor, word, 6);
    printf("seek from the end: '%s'\n", word);
    pread(descriptor, word, 5, 6);
    word[5] = 0;
    printf("pread: '%s', offset still %ld\n", word, (long)lseek(descriptor, 0, SEEK_CUR));
    close(descriptor);

    DIR *directory = opendir("files/data");
    char *names[16];
    int count = 0;
    struct dirent *entry;
    while (directory && (entry = readdir(directory)) && count < 16)
        names[count++] = strdup(entry->d_name);
    closedir(directory);
    qsort(names, count, sizeof names[0], compare);
    for (int i = 0; i < count; i++)
        printf("entry %s\n", names[i]);

    struct stat directory_status;
    int result = stat("files/data", &directory_status);
    printf("stat directory %d, is directory %d\n", result, S_ISDIR(directory_status.st_mode));
    result = open("files/missing", O_RDONLY);
    printf("missing file %d %s\n", result, strerror(errno));
    result = access("files/nothing", R_OK);
    printf("access missing %d %s\n", result, strerror(errno));
    printf("access input %d\n", access("files/input.txt", R_OK));

    /* A private mapping of the file, and descriptors sharing an offset. */
    descriptor = open("files/input.txt", O_RDONLY);
    char *mapped = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, descriptor, 0);
    printf("mapped: %.10s, zero past the end %d\n", mapped, mapped[status.st_size] == 0);
    int copy = dup(descriptor);
    read(descriptor, word, 6);
    printf("dup %d shares the offset: %ld\n", copy > descriptor, (long)lseek(copy, 0, SEEK_CUR));
    printf("fcntl getfl read-only %d, stdout write-only %d\n", (fcntl(descriptor, F_GETFL) & O_ACCMODE) == O_RDONLY, (fcntl(1, F_GETFL) & O_ACCMODE) == O_WRONLY);
    int moved = dup2(copy, 42);
    printf("dup2 %d, closing both %d %d\n", moved, close(copy), close(42));
    return 0;
}
