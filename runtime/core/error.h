// One error type for all host code, thrown by the CHECK-style macros below with file:line and
// the failed condition. `main` catches it, prints `[rank r/P] error: ...` and aborts the job.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace infoflow {

class Error : public std::runtime_error {
  public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace infoflow

// IF_CHECK(cond, stream-expression): throws infoflow::Error naming file:line and the condition.
#define IF_CHECK(cond, msg)                                                                 \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            std::ostringstream if_check_os_;                                                \
            if_check_os_ << msg;                                                            \
            ::infoflow::detail::throw_error(__FILE__, __LINE__, #cond, if_check_os_.str()); \
        }                                                                                   \
    } while (0)

// IF_FAIL(stream-expression): unconditional error.
#define IF_FAIL(msg)                                                                      \
    do {                                                                                  \
        std::ostringstream if_check_os_;                                                  \
        if_check_os_ << msg;                                                              \
        ::infoflow::detail::throw_error(__FILE__, __LINE__, nullptr, if_check_os_.str()); \
    } while (0)
