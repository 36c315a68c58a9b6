// The one translation unit that builds Catch2's main (catch.hpp compiles slowly).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
