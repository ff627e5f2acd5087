/* An ordinary ADIOS2 C reader of the "field" variable (see cxx_writer.cpp), engine from the
 * XML configuration. c_reader CONFIG STREAM: prints one line per step, exit 0 when every
 * value is right. */
#include <adios2_c.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: c_reader CONFIG STREAM\n");
        return 2;
    }
    adios2_adios *adios = adios2_init_config_serial(argv[1]);
    adios2_io *io = adios ? adios2_declare_io(adios, "SimulationOutput") : NULL;
    adios2_engine *engine = io ? adios2_open(io, argv[2], adios2_mode_read) : NULL;
    if (!engine) {
        fprintf(stderr, "c_reader: cannot open stream %s\n", argv[2]);
        return 1;
    }
    size_t steps = 0;
    for (;;) {
        adios2_step_status status;
        if (adios2_begin_step(engine, adios2_step_mode_read, 10.0f, &status) != adios2_error_none)
            return 1;
        if (status == adios2_step_status_end_of_stream)
            break;
        if (status != adios2_step_status_ok) {
            fprintf(stderr, "c_reader: no step within 10 s\n");
            return 1;
        }
        adios2_variable *field = adios2_inquire_variable(io, "field");
        size_t ndims = 0, shape[2] = {0, 0}, step = 0;
        if (!field || adios2_variable_ndims(&ndims, field) != adios2_error_none || ndims != 2 ||
            adios2_variable_shape(shape, field) != adios2_error_none) {
            fprintf(stderr, "c_reader: no 2-D variable 'field'\n");
            return 1;
        }
        double *data = malloc(shape[0] * shape[1] * sizeof *data);
        if (!data || adios2_get(engine, field, data, adios2_mode_sync) != adios2_error_none)
            return 1;
        adios2_current_step(&step, engine);
        adios2_end_step(engine);
        size_t bad = 0;
        for (size_t k = 0; k < shape[0] * shape[1]; k++)
            bad += data[k] != (double)step * 1e6 + (double)k;
        free(data);
        printf("step %zu %s shape %zux%zu\n", step, bad ? "WRONG" : "ok", shape[0], shape[1]);
        if (bad)
            return 1;
        steps++;
    }
    adios2_close(engine);
    adios2_finalize(adios);
    printf("end of stream after %zu steps\n", steps);
    return 0;
}
