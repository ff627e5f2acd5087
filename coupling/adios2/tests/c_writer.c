/* The stream cxx_writer.cpp writes, from C through clowder_adios2.h (no ADIOS2 linked):
 * "field" (ROWS x COLS doubles in two blocks, value s * 1e6 + i * COLS + j), "step" (int32),
 * "label" (string), "local" (3 int64), attribute "units" = "kelvin".
 * c_writer STREAM STEPS ROWS COLS [PARAMS]     (PARAMS as clowder_adios2_open takes them) */
#include "clowder_adios2.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int fail(const char *what)
{
	fprintf(stderr, "c_writer: %s: %s\n", what, clowder_adios2_error());
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 5 && argc != 6) {
		fprintf(stderr, "usage: c_writer STREAM STEPS ROWS COLS [PARAMS]\n");
		return 2;
	}
	size_t steps = strtoul(argv[2], NULL, 10), rows = strtoul(argv[3], NULL, 10),
	       cols = strtoul(argv[4], NULL, 10), half = rows / 2;
	clowder_adios2_writer *w = clowder_adios2_open(argv[1], argc == 6 ? argv[5] : NULL);
	if (!w)
		return fail("open");
	if (clowder_adios2_attribute_string(w, "units", "kelvin") != 0)
		return fail("attribute");
	double *data = malloc(rows * cols * sizeof *data);
	if (!data)
		return 1;
	size_t shape[2] = {rows, cols}, top[2] = {0, 0}, bottom[2] = {half, 0};
	size_t top_count[2] = {half, cols}, bottom_count[2] = {rows - half, cols}, three = 3;
	for (size_t s = 0; s < steps; s++) {
		for (size_t k = 0; k < rows * cols; k++)
			data[k] = (double)s * 1e6 + (double)k;
		int32_t step = (int32_t)s;
		int64_t local[3] = {(int64_t)s, (int64_t)s + 1, (int64_t)s + 2};
		char label[32];
		snprintf(label, sizeof label, "step-%zu", s);
		if (clowder_adios2_begin_step(w) != 0 ||
		    clowder_adios2_put(w, "field", "double", 2, shape, top, top_count, data) != 0 ||
		    clowder_adios2_put(w, "field", "double", 2, shape, bottom, bottom_count,
				       data + half * cols) != 0 ||
		    clowder_adios2_put(w, "step", "int32_t", 0, NULL, NULL, NULL, &step) != 0 ||
		    clowder_adios2_put_string(w, "label", label) != 0 ||
		    clowder_adios2_put(w, "local", "int64_t", 1, NULL, NULL, &three, local) != 0 ||
		    clowder_adios2_end_step(w) != 0)
			return fail("step");
	}
	free(data);
	return clowder_adios2_close(w) == 0 ? 0 : fail("close");
}
