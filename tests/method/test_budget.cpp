// Regression test of the position-budget check (docs/design.md §11: contexts longer than the model's
// positions are an error): decode.max_new_tokens near INT_MAX used to overflow the int sum
// T + Q + max_new - 1, wrap negative and pass the check.
#include <catch2/catch.hpp>
#include <climits>

#include "tests/method/method_fixture.h"

using namespace infoflow;
using namespace infoflow::test;

TEST_CASE("a decode budget near INT_MAX is refused by the position check, not wrapped",
          "[method][faults]") {
    TinyModel tm("tiny", 2);
    const PreparedRequest req = random_request(3, tm.w.config.n_vocab, 4, {9, 7}, 6);
    for (auto m : {Config::Method::full, Config::Method::infoflow}) {
        Config cfg = method_config(m);
        for (int max_new : {INT_MAX, INT_MAX - 20, tm.w.config.n_ctx_train}) {
            cfg.decode.max_new_tokens = max_new;
            CAPTURE(to_string(m), max_new);
            CHECK_THROWS_WITH(run_method(*tm.m, req, cfg, {}),
                              Catch::Contains("positions") && Catch::Contains("the model"));
        }
    }
}
