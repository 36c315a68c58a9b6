#include "runtime/core/error.h"

#include <cstring>

namespace infoflow::detail {

void throw_error(const char* file, int line, const char* cond, const std::string& msg) {
    const char* base = std::strrchr(file, '/');
    std::ostringstream os;
    os << msg << " (" << (base ? base + 1 : file) << ":" << line;
    if (cond) os << ", check failed: " << cond;
    os << ")";
    throw Error(os.str());
}

}  // namespace infoflow::detail
