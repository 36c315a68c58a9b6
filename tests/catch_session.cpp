// The one translation unit that compiles Catch2's implementation (tests/catch_session.h).
#define CATCH_CONFIG_RUNNER
#include "tests/catch_session.h"

#include <catch2/catch.hpp>

namespace infoflow::testing {

int run_catch_session(int argc, char** argv) {
    Catch::Session session;
    int rc = session.applyCommandLine(argc, argv);
    if (rc == 0) rc = session.run();
    return rc;
}

}  // namespace infoflow::testing
