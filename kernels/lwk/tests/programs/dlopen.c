/* dlopen: a system library through /etc/ld.so.cache, a library of the job's through
 * LD_LIBRARY_PATH (set by re-executing itself), symbols, RELRO data and dlclose, and the
 * loader's errors for a missing, a truncated and a non-ELF library.
 * lwk-test: libcs=dynamic libs=libm.so.6 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void try_open(const char *name) {
    void *library = dlopen(name, RTLD_NOW);
    if (library) {
        printf("%s: loaded\n", name);
        dlclose(library);
    } else {
        printf("%s: %s\n", name, dlerror());
    }
}

int main(int argc, char **argv) {
    (void)argc;
    const char *search = getenv("LD_LIBRARY_PATH");
    printf("LD_LIBRARY_PATH = %s\n", search ? search : "(unset)");
    void *libm = dlopen("libm.so.6", RTLD_NOW);
    if (!libm) {
        printf("libm.so.6: %s\n", dlerror());
        return 1;
    }
    double (*cosine)(double) = (double (*)(double))dlsym(libm, "cos");
    printf("cos(0.5) = %.9f\n", cosine(0.5));
    dlclose(libm);
    if (!search) {
        try_open("libclowderplugin.so");
        try_open("files/lib/libtruncated.so");
        try_open("files/lib/libtext.so");
        try_open("/no/such/libnothing.so");
        fflush(stdout);
        char *env[] = {"LD_LIBRARY_PATH=files/lib", NULL};
        execve("/proc/self/exe", argv, env);
        perror("execve");
        return 1;
    }
    void *plugin = dlopen("libclowderplugin.so", RTLD_NOW);
    if (!plugin) {
        printf("libclowderplugin.so: %s\n", dlerror());
        return 1;
    }
    int (*twice)(int) = (int (*)(int))dlsym(plugin, "plugin_twice");
    const char *(*name)(int) = (const char *(*)(int))dlsym(plugin, "plugin_name");
    int (*calls)(void) = (int (*)(void))dlsym(plugin, "plugin_calls");
    printf("plugin_twice(21) = %d, plugin_twice(5) = %d\n", twice(21), twice(5));
    printf("plugin_name: %s %s %s, calls %d\n", name(0), name(2), name(7), calls());
    printf("missing symbol: %s\n", dlsym(plugin, "plugin_absent") ? "found" : "not found");
    printf("dlclose: %d\n", dlclose(plugin));
    return 4;
}
