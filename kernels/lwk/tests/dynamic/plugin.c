/* A shared library for the dynamic-linking tests (test.sh builds it as
 * files/lib/libclowderplugin.so): found through LD_LIBRARY_PATH by dlopen, and the library a
 * program is linked against but cannot find. Its data and relocations exercise RELRO. */
#include <stdio.h>

static const char *const names[] = {"zero", "one", "two"};
static int calls;

int plugin_twice(int value) {
    calls++;
    return 2 * value;
}

const char *plugin_name(int index) {
    return index >= 0 && index < 3 ? names[index] : "many";
}

int plugin_calls(void) {
    return calls;
}
