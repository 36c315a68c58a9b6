// main() of the plain test executables; Catch2's implementation is in tests/catch_session.cpp.
#include "tests/catch_session.h"

int main(int argc, char** argv) { return infoflow::testing::run_catch_session(argc, argv); }
