// Catch2's runner, compiled once (tests/catch_session.cpp): catch.hpp's implementation is the
// slowest thing in the build (~55 s per translation unit), and every test main used to compile it
// again. The mains that need their own start-up (MPI, the GPU checks) call this instead.
#pragma once

namespace infoflow::testing {

// Catch::Session: applies the command line, runs the selected test cases, returns the exit code.
int run_catch_session(int argc, char** argv);

}  // namespace infoflow::testing
