// The C writer API (include/clowder_adios2.h) over StreamWriter: the same segments as the
// ADIOS2 engine's, with no ADIOS2 library linked (its type names are spelled here).
#include "clowder_adios2.h"
#include "c_api.h"
#include "stream_writer.h"

#include <cstring>
#include <map>
#include <stdexcept>

struct clowder_adios2_writer
{
    std::unique_ptr<clowder_adios::StreamWriter> stream;
    std::map<std::string, std::string> attributes;
};

namespace
{
thread_local std::string lastError;

// The element size of the ADIOS2 type names this API takes, 0 for any other name.
size_t ElemSize(const std::string &type)
{
    static const std::map<std::string, size_t> sizes = {
        {"int8_t", 1}, {"int16_t", 2},  {"int32_t", 4},  {"int64_t", 8}, {"uint8_t", 1},
        {"uint16_t", 2}, {"uint32_t", 4}, {"uint64_t", 8}, {"float", 4},   {"double", 8},
        {"char", 1}};
    auto it = sizes.find(type);
    return it == sizes.end() ? 0 : it->second;
}

template <class Fn>
int Guard(Fn &&fn)
{
    return clowder_adios::Guard(lastError, std::forward<Fn>(fn));
}

adios2::Params ParseParams(const char *text)
{
    adios2::Params params;
    std::string all = text ? text : "";
    size_t at = 0;
    while (at < all.size())
    {
        size_t end = all.find(',', at);
        std::string pair = all.substr(at, end == std::string::npos ? std::string::npos : end - at);
        size_t eq = pair.find('=');
        if (eq == std::string::npos || eq == 0)
            throw std::invalid_argument("clowder engine: parameter '" + pair +
                                        "' is not Key=Value");
        params[pair.substr(0, eq)] = pair.substr(eq + 1);
        at = end == std::string::npos ? all.size() : end + 1;
    }
    return params;
}

void Check(clowder_adios2_writer *w)
{
    if (!w || !w->stream)
        throw std::invalid_argument("clowder engine: no writer (NULL)");
}
} // namespace

extern "C" {

clowder_adios2_writer *clowder_adios2_open(const char *stream, const char *params)
{
    auto *w = new clowder_adios2_writer;
    int rc = Guard([&] {
        if (!stream)
            throw std::invalid_argument("clowder engine: no stream name (NULL)");
        clowder_adios::Params p = clowder_adios::Params::Parse(ParseParams(params));
        w->stream = std::make_unique<clowder_adios::StreamWriter>(p.Stream(stream), p);
    });
    if (rc == 0)
        return w;
    delete w;
    return nullptr;
}

int clowder_adios2_begin_step(clowder_adios2_writer *w)
{
    return Guard([&] {
        Check(w);
        w->stream->BeginStep();
    });
}

int clowder_adios2_put(clowder_adios2_writer *w, const char *name, const char *type,
                       size_t ndims, const size_t *shape, const size_t *start,
                       const size_t *count, const void *data)
{
    return Guard([&] {
        Check(w);
        if (!name || !type || !data || (ndims > 0 && !count) || (!shape != !start))
            throw std::invalid_argument("clowder engine: put: a NULL argument");
        size_t elem = ElemSize(type);
        if (elem == 0)
            throw std::invalid_argument("clowder engine: put of '" + std::string(name) +
                                        "': unknown type '" + type + "'");
        if (ndims > clowder_adios::kMaxDims)
            throw std::invalid_argument("clowder engine: put of '" + std::string(name) +
                                        "': too many dimensions");
        std::vector<size_t> c(count, count + ndims), sh, st;
        size_t bytes = elem;
        for (size_t n : c)
            if (__builtin_mul_overflow(bytes, n, &bytes))
                throw std::invalid_argument("clowder engine: put of '" + std::string(name) +
                                            "': its count overflows");
        clowder_adios::Kind kind = clowder_adios::Kind::Value;
        if (ndims > 0 && shape)
        {
            kind = clowder_adios::Kind::GlobalArray;
            sh.assign(shape, shape + ndims);
            st.assign(start, start + ndims);
            for (size_t d = 0; d < ndims; ++d)
                if (st[d] > sh[d] || c[d] > sh[d] - st[d])
                    throw std::invalid_argument("clowder engine: put of '" + std::string(name) +
                                                "': start + count exceeds the shape in "
                                                "dimension " +
                                                std::to_string(d));
        }
        else if (ndims > 0)
            kind = clowder_adios::Kind::LocalArray;
        w->stream->AddBlock(name, type, kind, sh, st, c, data, bytes);
    });
}

int clowder_adios2_put_string(clowder_adios2_writer *w, const char *name, const char *value)
{
    return Guard([&] {
        Check(w);
        if (!name || !value)
            throw std::invalid_argument("clowder engine: put_string: a NULL argument");
        w->stream->AddBlock(name, "string", clowder_adios::Kind::Value, {}, {}, {}, value,
                            std::strlen(value));
    });
}

int clowder_adios2_attribute_string(clowder_adios2_writer *w, const char *name,
                                    const char *value)
{
    return Guard([&] {
        Check(w);
        if (!name || !value)
            throw std::invalid_argument("clowder engine: attribute_string: a NULL argument");
        w->attributes[name] = value;
    });
}

int clowder_adios2_end_step(clowder_adios2_writer *w)
{
    return Guard([&] {
        Check(w);
        if (!w->stream->InStep())
            throw std::logic_error("clowder engine: EndStep without BeginStep");
        for (const auto &[name, value] : w->attributes)
        {
            // A string attribute's values: a uint32 length and the bytes (format.h).
            std::vector<uint8_t> bytes(sizeof(uint32_t) + value.size());
            uint32_t len = static_cast<uint32_t>(value.size());
            std::memcpy(bytes.data(), &len, sizeof len);
            std::memcpy(bytes.data() + sizeof len, value.data(), value.size());
            w->stream->AddAttribute(name, "string", true, 1, bytes);
        }
        w->stream->EndStep();
    });
}

int clowder_adios2_close(clowder_adios2_writer *w)
{
    int rc = Guard([&] {
        Check(w);
        if (w->stream->InStep() && clowder_adios2_end_step(w) != 0)
            throw std::runtime_error(lastError);
        w->stream->Close();
    });
    delete w;
    return rc;
}

const char *clowder_adios2_error(void) { return lastError.c_str(); }
}
