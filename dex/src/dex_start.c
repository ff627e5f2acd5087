/* Linked into the application (not into libdex.so) together with
 * -Wl,--wrap=main: crt1 then calls __wrap_main, which lets libdex run the
 * real main on a thread whose stack lives in shared memory. */
int dex_run_main(int (*main_fn)(int, char **, char **), int argc, char **argv, char **envp);
int __real_main(int argc, char **argv, char **envp);

int __wrap_main(int argc, char **argv, char **envp)
{
	return dex_run_main(__real_main, argc, argv, envp);
}
