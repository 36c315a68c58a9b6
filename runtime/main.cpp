// infoflow_sp: answers questions over long contexts (docs/design.md §1, §9).
//   infoflow_sp --config FILE [--set section.key=value ...] [--out FILE.json]
#include <algorithm>
#include <cstdio>
#include <exception>

#include "comm/communicator.h"
#include "kernels/cpu/cpu_features.h"
#include "runtime/config/cli.h"
#include "runtime/config/config_reference.h"
#include "runtime/core/build_info.h"
#include "runtime/jobs/jobs.h"

int main(int argc, char** argv) {
    using namespace infoflow;
    std::unique_ptr<CommEnv> env;
    try {
        const CliArgs args = parse_cli(argc, argv);
        if (args.help) {
            std::printf("%s", cli_usage(argv[0]).c_str());
            return 0;
        }
        if (args.version) {
            const BuildInfo& b = build_info();
            std::printf("infoflow_sp %s (commit %s, %s, %s)\nfeatures: %s\n", b.version, b.commit,
                        b.build_type, b.compiler, b.features);
            if (*b.found_unused) std::printf("found, not used yet: %s\n", b.found_unused);
            std::string paths;
            for (const cpu::CpuIsa p : cpu::cpu_paths_runnable())
                paths += std::string(paths.empty() ? "" : " ") + cpu::cpu_isa_name(p);
            std::printf("cpu paths: %s (this run: %s)\n", paths.c_str(),
                        cpu::cpu_isa_name(cpu::active_cpu_isa()));
            return 0;
        }
        if (args.print_config_reference) {
            std::printf("%s", config_reference_markdown().c_str());
            return 0;
        }
        const Config cfg = load_config_from_cli(args);
        if (args.print_config) {
            std::printf("%s\n", cfg.to_json().dump(2).c_str());
            return 0;
        }
        install_interrupt_handlers(launcher_world_rank(), std::max(1, launcher_world_size()));
        // MPI starts when a launcher started us (or parallel.comm asks for it); every rank
        // checks that it runs the same configuration before any work.
        env = init_comm(&argc, &argv, to_string(cfg.parallel.comm));
        CommOptions comm_opts;
        comm_opts.backend = to_string(cfg.model.backend);
        comm_opts.timeout_s = cfg.parallel.timeout_s;
        comm_opts.startup_timeout_s = cfg.parallel.startup_timeout_s;
        std::unique_ptr<Communicator> comm =
            make_communicator(to_string(cfg.parallel.comm), comm_opts);
        install_interrupt_handlers(comm->rank(), comm->size());
        check_same_config(*comm, cfg.hash());
        comm->set_link(detect_link(*comm));
        if (comm->rank() == 0) check_outputs_writable(cfg);
        run_job(cfg, *comm);
        if (cfg.model.backend == Config::Backend::cpu) cpu::cpu_check_expected_path();
        comm->barrier();
        return 0;
    } catch (const std::exception& e) {
        // Prints "[rank r/P] error: ..." and ends every rank (MPI_Abort), so none is left
        // waiting in a collective.
        abort_job(e.what());
    }
}
