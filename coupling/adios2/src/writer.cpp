#include "writer.h"
#include "types.h"

#include <stdexcept>

namespace clowder_adios
{

namespace
{
size_t Elements(const adios2::Dims &count)
{
    size_t n = 1;
    for (size_t c : count)
        n *= c;
    return n;
}

void Append(std::vector<uint8_t> &out, const void *p, size_t n)
{
    const uint8_t *b = static_cast<const uint8_t *>(p);
    out.insert(out.end(), b, b + n);
}
} // namespace

Writer::Writer(adios2::IO io, const std::string &name, adios2::Mode mode)
: PluginEngineInterface(io, name, mode)
{
    Params params = Params::Parse(io.Parameters());
    m_Name = params.Stream(io.Name()); // `name` is the plugin's (see Params::streamName)
    m_Stream = std::make_unique<StreamWriter>(m_Name, params);
}

adios2::StepStatus Writer::BeginStep(adios2::StepMode, const float)
{
    m_Stream->BeginStep();
    return adios2::StepStatus::OK;
}

template <class T>
void Writer::Put(adios2::Variable<T> &variable, const T *values)
{
    const std::string name = variable.Name();
    if constexpr (std::is_same_v<T, std::string>)
    {
        m_Stream->AddBlock(name, adios2::GetType<T>(), Kind::Value, {}, {}, {}, values->data(),
                           values->size());
    }
    else
    {
        switch (variable.ShapeID())
        {
        case adios2::ShapeID::GlobalValue:
        case adios2::ShapeID::LocalValue:
            m_Stream->AddBlock(name, adios2::GetType<T>(), Kind::Value, {}, {}, {}, values,
                               sizeof(T));
            break;
        case adios2::ShapeID::GlobalArray:
        {
            adios2::Dims shape = variable.Shape(), start = variable.Start(),
                         count = variable.Count();
            if (start.size() != shape.size() || count.size() != shape.size())
                throw std::invalid_argument("clowder engine: variable '" + name +
                                            "': shape, start and count differ in dimensions");
            for (size_t d = 0; d < shape.size(); ++d)
                if (start[d] > shape[d] || count[d] > shape[d] - start[d])
                    throw std::invalid_argument("clowder engine: variable '" + name +
                                                "': start + count exceeds the shape in "
                                                "dimension " +
                                                std::to_string(d));
            m_Stream->AddBlock(name, adios2::GetType<T>(), Kind::GlobalArray, shape, start, count,
                               values, Elements(count) * sizeof(T));
            break;
        }
        case adios2::ShapeID::LocalArray:
        {
            adios2::Dims count = variable.Count();
            m_Stream->AddBlock(name, adios2::GetType<T>(), Kind::LocalArray, {}, {}, count,
                               values, Elements(count) * sizeof(T));
            break;
        }
        default:
            throw std::invalid_argument("clowder engine: variable '" + name +
                                        "': joined arrays are not supported");
        }
    }
}

// Deferred puts are copied at once too: the data is in its segment before EndStep, which is
// what deferred mode allows, and the application may reuse its buffer sooner.
#define declare(T)                                                                                 \
    void Writer::DoPutSync(adios2::Variable<T> variable, const T *values)                          \
    {                                                                                              \
        Put(variable, values);                                                                     \
    }                                                                                              \
    void Writer::DoPutDeferred(adios2::Variable<T> variable, const T *values)                      \
    {                                                                                              \
        Put(variable, values);                                                                     \
    }
ADIOS2_FOREACH_STDTYPE_1ARG(declare)
#undef declare

void Writer::AddAttributes()
{
    for (const auto &[name, info] : m_IO.AvailableAttributes())
    {
        auto typeIt = info.find("Type");
        if (typeIt == info.end())
            continue;
        DispatchType(typeIt->second, [&](auto tag) {
            using T = typename decltype(tag)::type;
            if constexpr (std::is_same_v<T, std::complex<float>> ||
                          std::is_same_v<T, std::complex<double>>)
                return; // ADIOS2 has no complex attributes
            else
            {
                adios2::Attribute<T> attr = m_IO.InquireAttribute<T>(name);
                if (!attr)
                    return;
                std::vector<T> data = attr.Data();
                std::vector<uint8_t> values;
                if constexpr (std::is_same_v<T, std::string>)
                    for (const std::string &s : data)
                    {
                        uint32_t len = static_cast<uint32_t>(s.size());
                        Append(values, &len, sizeof len);
                        Append(values, s.data(), s.size());
                    }
                else
                    Append(values, data.data(), data.size() * sizeof(T));
                m_Stream->AddAttribute(name, typeIt->second, attr.IsValue(),
                                       static_cast<uint32_t>(data.size()), values);
            }
        });
    }
}

void Writer::EndStep()
{
    if (!m_Stream->InStep())
        throw std::logic_error("clowder engine: EndStep without BeginStep");
    AddAttributes();
    m_Stream->EndStep();
}

void Writer::DoClose(const int)
{
    if (m_Stream->InStep())
        EndStep();
    m_Stream->Close();
}

} // namespace clowder_adios
