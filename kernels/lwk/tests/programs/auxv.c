/* The auxiliary vector as Linux's ELF loader sets it, checked against what the program and its
 * loader see of themselves: AT_ENTRY is the program's entry, AT_PHDR/AT_PHENT/AT_PHNUM its
 * program headers, AT_BASE where the interpreter was placed (0 for a static program),
 * AT_EXECFN a path naming the executed file, AT_PAGESZ the page size.
 * lwk-test: libcs=glibc */
#define _GNU_SOURCE
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>

extern char _start[];

struct found {
    unsigned long program_phdr, program_phnum, interpreter_base;
};

static int visit(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct found *found = data;
    if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0') {
        if (!found->program_phdr) {
            found->program_phdr = (unsigned long)info->dlpi_phdr;
            found->program_phnum = info->dlpi_phnum;
        }
    } else if (strstr(info->dlpi_name, "ld-linux")) {
        found->interpreter_base = info->dlpi_addr;
    }
    return 0;
}

int main(void) {
    struct found found = {0};
    dl_iterate_phdr(visit, &found);
    unsigned long base = getauxval(AT_BASE);
    const char *execfn = (const char *)getauxval(AT_EXECFN);
    printf("AT_ENTRY is the program's entry: %s\n", getauxval(AT_ENTRY) == (unsigned long)_start ? "yes" : "no");
    printf("AT_PHDR, AT_PHNUM are the program's headers: %s\n",
           getauxval(AT_PHDR) == found.program_phdr && getauxval(AT_PHNUM) == found.program_phnum ? "yes" : "no");
    printf("AT_PHENT: %lu\n", getauxval(AT_PHENT));
    printf("AT_BASE: %s\n", base == 0 ? "0 (no interpreter)" : base == found.interpreter_base ? "the interpreter's base" : "wrong");
    printf("AT_EXECFN: %s\n", execfn && execfn[0] ? "a path" : "missing");
    printf("AT_PAGESZ: %lu\n", getauxval(AT_PAGESZ));
    return 0;
}
