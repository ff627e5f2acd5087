// An ordinary ADIOS2 reader of cxx_writer's (or py_writer.py's) stream; the engine comes from
// the XML configuration. Checks every value it reads and prints one line per step.
// cxx_reader CONFIG STREAM [R0 C0 NR NC]   (a selection of "field"; the whole array without)
// Exit 0 when every step read checks out, 1 on a wrong value or an error (printed).
#include <adios2.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 7)
    {
        std::fprintf(stderr, "usage: cxx_reader CONFIG STREAM [R0 C0 NR NC]\n");
        return 2;
    }
    try
    {
        adios2::ADIOS adios(argv[1]);
        adios2::IO io = adios.DeclareIO("SimulationOutput");
        adios2::Engine reader = io.Open(argv[2], adios2::Mode::Read);
        size_t steps = 0;
        while (true)
        {
            adios2::StepStatus status = reader.BeginStep(adios2::StepMode::Read, 10.0f);
            if (status == adios2::StepStatus::EndOfStream)
                break;
            if (status != adios2::StepStatus::OK)
            {
                std::fprintf(stderr, "cxx_reader: BeginStep: no step within 10 s\n");
                return 1;
            }
            auto field = io.InquireVariable<double>("field");
            if (!field)
            {
                std::fprintf(stderr, "cxx_reader: no double variable 'field'\n");
                return 1;
            }
            const adios2::Dims shape = field.Shape();
            adios2::Dims start{0, 0}, count = shape;
            if (argc == 7)
            {
                start = {std::strtoul(argv[3], nullptr, 10), std::strtoul(argv[4], nullptr, 10)};
                count = {std::strtoul(argv[5], nullptr, 10), std::strtoul(argv[6], nullptr, 10)};
            }
            field.SetSelection({start, count});
            std::vector<double> data(count[0] * count[1]);
            reader.Get(field, data.data(), adios2::Mode::Sync);
            const size_t s = reader.CurrentStep();
            int32_t step = -1;
            if (auto v = io.InquireVariable<int32_t>("step"))
                reader.Get(v, step, adios2::Mode::Sync);
            std::string label;
            if (auto v = io.InquireVariable<std::string>("label"))
                reader.Get(v, label, adios2::Mode::Sync);
            std::vector<int64_t> local(3, -1);
            if (auto v = io.InquireVariable<int64_t>("local"))
                reader.Get(v, local.data(), adios2::Mode::Deferred);
            std::string units;
            if (auto a = io.InquireAttribute<std::string>("units"))
                units = a.Data().front();
            reader.EndStep();
            size_t bad = 0;
            double sum = 0;
            for (size_t i = 0; i < count[0]; ++i)
                for (size_t j = 0; j < count[1]; ++j)
                {
                    double want =
                        double(s) * 1e6 + double((start[0] + i) * shape[1] + start[1] + j);
                    double got = data[i * count[1] + j];
                    bad += got != want;
                    sum += got;
                }
            bool ok = bad == 0 && step == int32_t(s) && label == "step-" + std::to_string(s) &&
                      local[0] == int64_t(s) && local[2] == int64_t(s) + 2 && units == "kelvin";
            std::printf("step %zu %s shape %zux%zu sel %zu+%zu,%zu+%zu sum %.17g label %s units "
                        "%s\n",
                        s, ok ? "ok" : "WRONG", shape[0], shape[1], start[0], count[0], start[1],
                        count[1], sum, label.c_str(), units.c_str());
            if (!ok)
                return 1;
            ++steps;
        }
        reader.Close();
        std::printf("end of stream after %zu steps\n", steps);
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "cxx_reader: %s\n", e.what());
        return 1;
    }
    return 0;
}
