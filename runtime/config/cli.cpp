// Command-line parsing for infoflow_sp: flags, usage text, and the effective config.
#include "runtime/config/cli.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"

namespace infoflow {

CliArgs parse_cli(int argc, char** argv) {
    std::vector<std::string> args;
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    return parse_cli(args);
}

CliArgs parse_cli(const std::vector<std::string>& args) {
    CliArgs out;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        std::string flag = a;
        std::string value;
        bool has_value = false;
        const size_t eq = a.find('=');
        if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
            flag = a.substr(0, eq);
            value = a.substr(eq + 1);
            has_value = true;
        }
        auto take_value = [&]() -> std::string {
            if (has_value) return value;
            if (i + 1 >= args.size()) throw Error("option " + flag + " needs a value (see --help)");
            return args[++i];
        };
        auto no_value = [&] {
            if (has_value) throw Error("option " + flag + " takes no value");
        };
        if (flag == "--config") {
            if (!out.config_path.empty()) throw Error("--config given twice");
            out.config_path = take_value();
            if (out.config_path.empty()) throw Error("--config needs a file name");
        } else if (flag == "--set") {
            out.sets.push_back(take_value());
        } else if (flag == "--out") {
            if (!out.out_path.empty()) throw Error("--out given twice");
            out.out_path = take_value();
            if (out.out_path.empty()) throw Error("--out needs a file name");
        } else if (flag == "--results-dir") {
            if (!out.results_dir.empty()) throw Error("--results-dir given twice");
            out.results_dir = take_value();
            if (out.results_dir.empty()) throw Error("--results-dir needs a directory");
        } else if (flag == "--help" || flag == "-h") {
            no_value();
            out.help = true;
        } else if (flag == "--version") {
            no_value();
            out.version = true;
        } else if (flag == "--print-config") {
            no_value();
            out.print_config = true;
        } else if (flag == "--print-config-reference") {
            no_value();
            out.print_config_reference = true;
        } else if (!a.empty() && a[0] == '-') {
            throw Error("unknown option '" + flag + "' (see --help)");
        } else {
            throw Error("unexpected argument '" + a + "' (options: --config FILE, --set K=V, " +
                        "--out FILE; see --help)");
        }
    }
    if (!out.out_path.empty() && !out.results_dir.empty()) {
        throw Error("--out and --results-dir exclude each other");
    }
    if (out.config_path.empty() && !out.help && !out.version && !out.print_config &&
        !out.print_config_reference) {
        throw Error("missing --config FILE (see --help)");
    }
    return out;
}

std::string cli_usage(const std::string& program) {
    return "usage: " + program +
           " --config FILE [--set section.key=value ...] [--out FILE.json]\n"
           "       " +
           program +
           " --print-config [--config FILE] [--set ...]\n"
           "\n"
           "Answers questions over long contexts: chunks are prefilled independently (one shard\n"
           "per MPI rank / GPU), then only the context tokens that matter for the question are\n"
           "recomputed (InfoFlow KV). The config's `job` says what runs: answer | niah | eval |\n"
           "bench-ttft | cache-build | reform-heads | sweep. Run one rank per shard under mpirun\n"
           "or srun; this build runs on the CPU (see --version).\n"
           "\n"
           "options:\n"
           "  --config FILE      run configuration (TOML); every key is in docs/config.md\n"
           "  --set KEY=VALUE    override one key after the file; VALUE is a TOML value, or\n"
           "                     plain text for strings. Repeatable. Examples:\n"
           "                       --set method.ratio=0.3   --set scoring.layers=[20,21]\n"
           "                       --set method.name=full   --set request.question=\"Who?\"\n"
           "  --out FILE.json    write machine-readable results here (overrides output.path)\n"
           "  --results-dir DIR  write them to DIR/NAME.json (+ .csv, .jsonl) instead, NAME =\n"
           "                     output.name or the config file's name (e.g. bench/results)\n"
           "  --print-config     print the effective config as JSON and exit\n"
           "  --print-config-reference\n"
           "                     print the reference of every config key (docs/config.md)\n"
           "  --version          print the version and exit\n"
           "  -h, --help         print this text and exit\n"
           "\n"
           "Relative paths in the config are resolved against the current directory.\n";
}

Config load_config_from_cli(const CliArgs& args) {
    Config cfg;
    if (!args.config_path.empty()) {
        cfg = load_config(args.config_path, args.sets);
    } else {
        apply_overrides(cfg, args.sets);
    }
    if (!args.out_path.empty()) cfg.output.path = args.out_path;
    if (!args.results_dir.empty()) {
        std::string name = cfg.output.name;
        if (name.empty()) {
            const std::string& p = args.config_path;
            const size_t slash = p.find_last_of('/');
            name = slash == std::string::npos ? p : p.substr(slash + 1);
            const size_t dot = name.find_last_of('.');
            if (dot != std::string::npos && dot > 0) name = name.substr(0, dot);
        }
        if (name.empty()) throw Error("--results-dir needs output.name or a --config file");
        cfg.output.path = args.results_dir + "/" + name + ".json";
        cfg.output.csv.clear();  // the CSV twin goes next to the JSON
    }
    check_implemented(cfg);
    return cfg;
}

namespace {

void check_writable(const std::string& path, const char* key) {
    if (path.empty()) return;
    struct stat st {};
    IF_CHECK(!(::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)),
             key << " '" << path << "' is a directory, not a file");
    try {
        AtomicFile probe(path);  // creates a temp file next to the target; removed on scope exit
    } catch (const Error& e) {
        IF_FAIL(key << ": " << e.what() << " (checked before the run, so that no result is lost)");
    }
}

// The lines the handler writes, formatted before any signal can arrive (only write(2) and
// _exit(2) are used in the handler: both are async-signal-safe).
char g_line_int[96];
char g_line_term[96];

extern "C" void on_interrupt(int sig) {
    const char* line = sig == SIGINT ? g_line_int : g_line_term;
    ssize_t ignored = ::write(STDERR_FILENO, line, std::strlen(line));
    (void)ignored;
    ::_exit(128 + sig);
}

}  // namespace

void check_outputs_writable(const Config& cfg) {
    check_writable(cfg.output.path, "--out / output.path");
    check_writable(cfg.output.csv, "output.csv");
}

void install_interrupt_handlers(int rank, int size) {
    std::snprintf(g_line_int, sizeof g_line_int, "[rank %d/%d] interrupted (SIGINT)\n", rank, size);
    std::snprintf(g_line_term, sizeof g_line_term, "[rank %d/%d] interrupted (SIGTERM)\n", rank,
                  size);
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace infoflow
