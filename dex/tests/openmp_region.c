/* OpenMP under DEX: each thread of a parallel region moves to a node at the
 * start of the region and back at its end, as the paper converted NPB; the
 * reduction and the per-thread placement must come out right. Built with
 * -fopenmp (see the Makefile). */
#include <dex.h>
#include <omp.h>
#include <stdio.h>

int main(void)
{
	long sum = 0;
	int placed_right = 0;
#pragma omp parallel num_threads(6) reduction(+ : sum) reduction(+ : placed_right)
	{
		int t = omp_get_thread_num();
		int want = t % dex_nodes();
		dex_migrate(want);
		placed_right += dex_node() == want;
		for (long i = t; i < 6000000; i += 6)
			sum += i % 7;
		dex_migrate(0);
	}
	int ok = sum == 17999997 && placed_right == 6;
	printf("%s openmp: sum %ld, %d/6 threads ran on their node\n", ok ? "PASS" : "FAIL", sum, placed_right);
	return !ok;
}
