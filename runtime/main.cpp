// infoflow_sp: answers questions over long contexts (DESIGN §1, §9).
//   infoflow_sp --config FILE [--set section.key=value ...] [--out FILE.json]
#include <cstdio>
#include <exception>

#include "runtime/config/cli.h"
#include "runtime/jobs/jobs.h"

int main(int argc, char** argv) {
    using namespace infoflow;
    const int rank = 0, n_ranks = 1;
    try {
        const CliArgs args = parse_cli(argc, argv);
        if (args.help) {
            std::printf("%s", cli_usage(argv[0]).c_str());
            return 0;
        }
        if (args.version) {
            std::printf("infoflow_sp %s\n", k_infoflow_version);
            return 0;
        }
        const Config cfg = load_config_from_cli(args);
        if (args.print_config) {
            std::printf("%s\n", cfg.to_json().dump(2).c_str());
            return 0;
        }
        run_job(cfg);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d/%d] error: %s\n", rank, n_ranks, e.what());
        return 1;
    }
}
