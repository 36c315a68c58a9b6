// The command line of infoflow_sp (docs/design.md §9):
//   infoflow_sp --config FILE [--set section.key=value ...] [--out FILE.json]
// parsed into CliArgs, and the effective Config built from it (file, then each --set in order,
// then --out, which overrides output.path).
#pragma once

#include <string>
#include <vector>

#include "runtime/config/config.h"

namespace infoflow {

struct CliArgs {
    std::string config_path;        // --config FILE
    std::vector<std::string> sets;  // --set section.key=value, in order, repeatable
    std::string out_path;           // --out FILE.json (overrides output.path)
    std::string results_dir;        // --results-dir DIR: results to DIR/<output.name>.json (+ .csv)
    bool help = false;              // --help, -h: print cli_usage() and exit
    bool version = false;           // --version: print the version and exit
    bool print_config = false;      // --print-config: print the effective config (JSON), exit
    // --print-config-reference: print the config key reference (docs/config.md) and exit.
    bool print_config_reference = false;
};

// Accepts "--flag value" and "--flag=value". Errors (infoflow::Error) for unknown flags, missing
// values, positional arguments, a repeated --config / --out, and a missing --config unless
// --help, --version, --print-config or --print-config-reference is given (--print-config alone
// prints the defaults).
CliArgs parse_cli(int argc, char** argv);
CliArgs parse_cli(const std::vector<std::string>& args);  // args without the program name

std::string cli_usage(const std::string& program = "infoflow_sp");

// Default config (no --config) or the file, then the --set overrides, then --out or
// --results-dir, then check_implemented.
Config load_config_from_cli(const CliArgs& args);

// Before the run (finding: an unwritable --out lost the whole computation): every output file
// of `cfg` (output.path, output.csv) can be created, by creating and removing a temp file next
// to it. Throws infoflow::Error naming the key and the path.
void check_outputs_writable(const Config& cfg);

// SIGINT and SIGTERM end the process with one line "[rank r/P] interrupted (SIGINT)" on stderr
// and exit code 130 / 143; no result file is half-written (results are written atomically).
// `rank`/`size` label the line; call again once they are known (e.g. after MPI start-up).
void install_interrupt_handlers(int rank, int size);

}  // namespace infoflow
