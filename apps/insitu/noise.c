/*
 * insitu-noise: the attach-noise run of XEMEM's Fig. 7, as an LWK job. Exports MIB of its own
 * memory (every page written first) as the named XEMEM segment NAME, then runs the
 * selfish-detour loop (apps/selfish/detour.h) for DURATION seconds while host processes attach
 * and detach parts of it, lists every detour, and removes the segment.
 *
 *   insitu-noise NAME MIB DURATION_S
 *
 * Prints "insitu-noise: made NAME" once the segment exists, then selfish's lines.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <xpmem.h>

#include "../args.h"
#include "../selfish/detour.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: insitu-noise NAME MIB DURATION_S\n");
        return 2;
    }
    const char *name = argv[1];
    size_t bytes = (size_t)arg_integer("insitu-noise", "MIB", argv[2], 1, 65536) << 20;
    double duration = arg_number("insitu-noise", "DURATION_S", argv[3], 0.1, 3600);
    if (strlen(name) > XEMEM_NAME_MAX) {
        fprintf(stderr, "insitu-noise: a segment name has at most %d characters\n", XEMEM_NAME_MAX);
        return 2;
    }
    char *region = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) {
        fprintf(stderr, "insitu-noise: mmap of %zu bytes: %s\n", bytes, strerror(errno));
        return 1;
    }
    /* Every page present before the loop: the attaches then resolve frames, not faults. */
    for (size_t offset = 0; offset < bytes; offset += 4096) region[offset] = (char)offset;
    xpmem_segid_t segid = xemem_make(region, bytes, name);
    if (segid <= 0) {
        fprintf(stderr, "insitu-noise: xemem_make(%s, %zu bytes): %s\n", name, bytes, strerror(errno));
        return 1;
    }
    printf("insitu-noise: made %s\n", name);
    fflush(stdout);
    static struct detours detours;
    detour_run(&detours, duration, 0);
    detour_print("insitu-noise", &detours, 1);
    if (xpmem_remove(segid)) {
        fprintf(stderr, "insitu-noise: xpmem_remove: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}
