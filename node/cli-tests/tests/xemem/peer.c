/* A host process using the XPMEM API through libxpmem, for the `clowder xemem ls` test.
 *
 *   peer owner NAME PAGES   make a named segment over PAGES private pages filled with a
 *                           pattern, print its segid, then hold it until stdin closes
 *   peer attach NAME PAGES  look the name up, get, attach, check the pattern, print "ok"
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xpmem.h>

static unsigned char pattern_byte(size_t index) {
    return (unsigned char)(index * 7 + 1);
}

static int owner(const char *name, size_t size) {
    /* Page-aligned private memory: the library converts it in place at make time. */
    unsigned char *memory = aligned_alloc(4096, size);
    if (!memory) return 1;
    for (size_t i = 0; i < size; i++) memory[i] = pattern_byte(i);
    xpmem_segid_t segid = xemem_make(memory, size, name);
    if (segid == -1) {
        fprintf(stderr, "xemem_make: %s\n", strerror(errno));
        return 1;
    }
    printf("%lld\n", (long long)segid);
    fflush(stdout);
    char line[16];
    while (fgets(line, sizeof line, stdin)) {
    }
    return xpmem_remove(segid) == 0 ? 0 : 1;
}

static int attacher(const char *name, size_t size) {
    xpmem_segid_t segid = xemem_lookup_segid(name);
    if (segid == -1) {
        fprintf(stderr, "xemem_lookup_segid: %s\n", strerror(errno));
        return 1;
    }
    xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
    if (apid == -1) {
        fprintf(stderr, "xpmem_get: %s\n", strerror(errno));
        return 1;
    }
    struct xpmem_addr addr = {.apid = apid, .offset = 0};
    unsigned char *attached = xpmem_attach(addr, size, NULL);
    if (attached == (void *)-1) {
        fprintf(stderr, "xpmem_attach: %s\n", strerror(errno));
        return 1;
    }
    for (size_t i = 0; i < size; i++) {
        if (attached[i] != pattern_byte(i)) {
            fprintf(stderr, "byte %zu is %u, expected %u\n", i, attached[i], pattern_byte(i));
            return 1;
        }
    }
    if (xpmem_detach(attached) != 0 || xpmem_release(apid) != 0) {
        fprintf(stderr, "detach/release: %s\n", strerror(errno));
        return 1;
    }
    printf("ok %zu bytes\n", size);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: peer owner|attach NAME PAGES\n");
        return 2;
    }
    size_t size = strtoull(argv[3], NULL, 10) * 4096;
    if (strcmp(argv[1], "owner") == 0) return owner(argv[2], size);
    if (strcmp(argv[1], "attach") == 0) return attacher(argv[2], size);
    return 2;
}
