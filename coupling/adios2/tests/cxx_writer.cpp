// An ordinary ADIOS2 writer: the engine comes from the XML configuration alone.
// cxx_writer CONFIG STREAM STEPS ROWS COLS [DIE_AT_STEP [PAUSE_MS]]
// Each step writes "field", a ROWS x COLS global array of doubles, as two blocks (the top and
// the bottom half), value(s, i, j) = s * 1e6 + i * COLS + j; "step" (int32), "label" (string)
// and "local" (a local array of 3 int64); attribute "units" = "kelvin". With DIE_AT_STEP the
// program kills itself in the middle of that step (after the first block); -1 never. PAUSE_MS:
// a pause after each step (a slow simulation).
#include <adios2.h>

#include <chrono>
#include <thread>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char **argv)
{
    if (argc < 6)
    {
        std::fprintf(stderr,
                     "usage: cxx_writer CONFIG STREAM STEPS ROWS COLS [DIE_AT_STEP [PAUSE_MS]]\n");
        return 2;
    }
    const size_t steps = std::strtoul(argv[3], nullptr, 10);
    const size_t rows = std::strtoul(argv[4], nullptr, 10);
    const size_t cols = std::strtoul(argv[5], nullptr, 10);
    const long dieAt = argc > 6 ? std::strtol(argv[6], nullptr, 10) : -1;
    const long pauseMs = argc > 7 ? std::strtol(argv[7], nullptr, 10) : 0;
    try
    {
        adios2::ADIOS adios(argv[1]);
        adios2::IO io = adios.DeclareIO("SimulationOutput");
        const size_t half = rows / 2;
        auto field = io.DefineVariable<double>("field", {rows, cols}, {0, 0}, {half, cols});
        auto step = io.DefineVariable<int32_t>("step");
        auto label = io.DefineVariable<std::string>("label");
        auto local = io.DefineVariable<int64_t>("local", {}, {}, {3});
        io.DefineAttribute<std::string>("units", "kelvin");
        adios2::Engine writer = io.Open(argv[2], adios2::Mode::Write);
        std::vector<double> data(rows * cols);
        for (size_t s = 0; s < steps; ++s)
        {
            for (size_t k = 0; k < data.size(); ++k)
                data[k] = double(s) * 1e6 + double(k);
            writer.BeginStep();
            field.SetSelection({{0, 0}, {half, cols}});
            writer.Put(field, data.data(), adios2::Mode::Sync);
            if (long(s) == dieAt)
                std::raise(SIGKILL);
            field.SetSelection({{half, 0}, {rows - half, cols}});
            writer.Put(field, data.data() + half * cols);
            writer.Put(step, int32_t(s));
            writer.Put(label, std::string("step-") + std::to_string(s));
            std::vector<int64_t> loc = {int64_t(s), int64_t(s) + 1, int64_t(s) + 2};
            writer.Put(local, loc.data(), adios2::Mode::Sync);
            writer.EndStep();
            std::this_thread::sleep_for(std::chrono::milliseconds(pauseMs));
        }
        writer.Close();
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "cxx_writer: %s\n", e.what());
        return 1;
    }
    return 0;
}
