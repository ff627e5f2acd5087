/* Loads each library named in argv, each in a child of its own, and says how it went: the
 * loader's error, "loaded", or the signal that ended the child (a corrupt library may crash
 * the loader, as it can on Linux). The kernel must carry on: the parent ends with status 0
 * after its last line, "survived". */
#include <dlfcn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        fflush(stdout);
        pid_t child = fork();
        if (child < 0) {
            perror("fork");
            return 1;
        }
        if (child == 0) {
            void *library = dlopen(argv[i], RTLD_NOW);
            printf("%s: %s\n", argv[i], library ? "loaded" : dlerror());
            fflush(stdout);
            _exit(0);
        }
        int status;
        if (waitpid(child, &status, 0) != child) {
            perror("waitpid");
            return 1;
        }
        if (WIFSIGNALED(status))
            printf("%s: killed by signal %d\n", argv[i], WTERMSIG(status));
    }
    printf("survived\n");
    return 0;
}
