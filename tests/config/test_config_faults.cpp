// Regression tests of the configuration's bad-input findings (docs/design.md §11), each built from its
// reproducer: invalid UTF-8 in a --set value used to pass the loader and surface later as a
// JSON library error naming neither key nor file; invalid UTF-8 in a .txt documents file was
// silently dropped by the tokenizer; an unwritable --out was found only after the run.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "runtime/config/cli.h"
#include "runtime/config/config.h"
#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "tests/test_util.h"

using namespace infoflow;
using Catch::Contains;

TEST_CASE("invalid UTF-8 in a --set value is an error naming the key", "[config][faults]") {
    for (const std::string bad : {"\xff", "caf\xc3", "\xed\xa0\x80", "\xc0\xaf", "ok \xf5\x80"}) {
        CAPTURE(bad.size());
        auto load = [&] {
            Config c = parse_config("", "t.toml", {"request.question=" + bad});
            return c.hash();  // the effective config must serialize
        };
        CHECK_THROWS_WITH(load(),
                          Contains("--set 'request.question=...'") && Contains("invalid UTF-8"));
    }
    // Valid multi-byte text passes and round-trips.
    const Config ok = parse_config("", "t.toml", {"request.question=caf\xc3\xa9 \xf0\x9f\x99\x82"});
    CHECK(ok.request.question == "caf\xc3\xa9 \xf0\x9f\x99\x82");
    CHECK_FALSE(ok.hash().empty());
}

TEST_CASE("invalid UTF-8 in a .txt documents file is an error naming file and line",
          "[config][faults]") {
    const std::string dir = test::shared_temp_dir("config_faults");
    const std::string txt = dir + "/docs.txt";
    write_file_atomic(txt, "first document\n---\nsecond \xff\xfe document\n");
    CHECK_THROWS_WITH(read_documents_file(txt),
                      Contains(txt) && Contains("invalid UTF-8") && Contains("line 3"));
    const std::string q = dir + "/question.txt";
    write_file_atomic(q, "Who \xc3\x28?");
    Config::RequestSection req;
    req.documents = {"a document"};
    req.question_file = q;
    CHECK_THROWS_WITH(load_request_text(req), Contains(q) && Contains("invalid UTF-8"));
    write_file_atomic(txt, "first document\n---\nsecond caf\xc3\xa9\n");
    CHECK(read_documents_file(txt) ==
          std::vector<std::string>{"first document", "second caf\xc3\xa9"});
}

TEST_CASE("output files are checked for writability before the run", "[config][faults]") {
    const std::string dir = test::shared_temp_dir("config_faults");
    Config cfg;
    cfg.output.path = dir + "/no_such_dir/r.json";
    CHECK_THROWS_WITH(check_outputs_writable(cfg),
                      Contains("--out") && Contains(cfg.output.path) && Contains("before the run"));
    cfg.output.path = dir;  // a directory
    CHECK_THROWS_WITH(check_outputs_writable(cfg), Contains("is a directory"));
    cfg.output.path = dir + "/r.json";
    cfg.output.csv = "/proc/no_such/x.csv";
    CHECK_THROWS_WITH(check_outputs_writable(cfg), Contains("output.csv"));
    cfg.output.csv.clear();
    CHECK_NOTHROW(check_outputs_writable(cfg));
    CHECK_FALSE(file_exists(cfg.output.path));  // the probe leaves nothing behind
    const std::string ro = dir + "/readonly";
    ::mkdir(ro.c_str(), 0555);
    cfg.output.path = ro + "/r.json";
    if (::geteuid() != 0) CHECK_THROWS_WITH(check_outputs_writable(cfg), Contains(ro));
}
