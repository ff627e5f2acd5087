/* `job_status exit N` exits with N; `job_status signal N` dies of signal N (its default
 * action): a job's exit code and its death by a signal, which must come back apart. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv)
{
	if (argc != 3)
		return 100;
	if (!strcmp(argv[1], "exit"))
		exit(atoi(argv[2]));
	signal(atoi(argv[2]), SIG_DFL);
	raise(atoi(argv[2]));
	return 101;
}
