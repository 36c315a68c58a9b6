#include "runtime/jobs/session.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "comm/communicator.h"
#include "kernels/cpu/cpu_features.h"
#include "runtime/core/error.h"
#include "runtime/formats/gguf.h"
#include "runtime/model/model_loader.h"

namespace infoflow {

const Tokenizer& Session::tok() const {
    IF_CHECK(tokenizer != nullptr, "model '" << weights->source
                                             << "' has no tokenizer (synthetic random: models "
                                                "serve benchmarks only)");
    return *tokenizer;
}

const ChatTemplate& Session::chat_template() const {
    tok();
    return *chat;
}

std::unique_ptr<Session> open_session(const Config& cfg, int local_rank) {
    const auto t0 = std::chrono::steady_clock::now();
    auto s = std::make_unique<Session>();
    const std::string& path = cfg.model.path;
    // The backend first: a device backend selects its GPU before anything else touches CUDA,
    // and generates random: weights itself (they never exist on the host).
    // The CPU kernel path is fixed before any kernel runs (cpu.isa; "auto" leaves the choice to
    // INFOFLOW_CPU_ISA or the CPU).
    if (cfg.cpu.isa != Config::CpuIsa::automatic) cpu::set_cpu_isa_override(to_string(cfg.cpu.isa));
    s->backend = make_backend(to_string(cfg.model.backend), cfg.model.threads, local_rank);
    LoadOptions opt;
    opt.check_finite = cfg.model.check_finite;
    // Stored-type weights are a CPU-backend path; a device backend uploads fp32 (bf16 there).
    opt.native_weights =
        cfg.model.weights == Config::Weights::native && s->backend->supports_native_weights();
    opt.generate_on_backend = cfg.model.backend != Config::Backend::cpu;
    s->weights = std::make_unique<ModelWeights>(load_model_weights(path, opt));
    s->trained_positions = s->weights->config.n_ctx_train;
    if (cfg.model.positions > 0) {
        s->weights->config.n_ctx_train = cfg.model.positions;
        if (cfg.model.positions > s->trained_positions && local_rank == 0) {
            std::fprintf(stderr,
                         "warning: model.positions = %d runs past the %d positions %s was "
                         "trained on: answers there mean nothing (timing only)\n",
                         cfg.model.positions, s->trained_positions, path.c_str());
        }
    }
    if (path.rfind("random:", 0) != 0) {
        struct stat st {};
        IF_CHECK(::stat(path.c_str(), &st) == 0, "model.path '" << path << "' does not exist");
        if (S_ISDIR(st.st_mode)) {
            s->tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_hf_dir(path));
        } else {
            GgufFile gguf(path);
            s->tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(gguf));
        }
        std::string chat_name = to_string(cfg.request.chat_template);
        s->chat = std::make_unique<ChatTemplate>(*s->tokenizer, chat_name);
    }
    s->model = std::make_unique<Model>(*s->backend, *s->weights);
    s->model->set_kv_dtype(cfg.model.kv_dtype == Config::KvDType::f16    ? KvDtype::f16
                           : cfg.model.kv_dtype == Config::KvDType::bf16 ? KvDtype::bf16
                                                                         : KvDtype::f32);
    s->load_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return s;
}

std::vector<RankPlacement> gather_placement(Communicator& comm, const Backend& backend) {
    // Fixed-size records: host name [64], device name [128], local rank and size as text [32].
    constexpr size_t kHost = 64, kDevice = 128, kLocal = 32, kRecord = kHost + kDevice + kLocal;
    char mine[kRecord] = {};
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    std::memcpy(mine, host, std::min(std::strlen(host), kHost - 1));
    const std::string d = backend.device();
    std::memcpy(mine + kHost, d.data(), std::min(d.size(), kDevice - 1));
    std::snprintf(mine + kHost + kDevice, kLocal, "%d %d", comm.local_rank(), comm.local_size());
    std::vector<char> all(kRecord * size_t(comm.size()));
    {
        PhaseScope scope(comm, "placement");
        comm.all_gather(mine, kRecord, all.data());
    }
    std::vector<RankPlacement> out;
    for (int r = 0; r < comm.size(); ++r) {
        const char* rec = all.data() + size_t(r) * kRecord;
        RankPlacement p;
        p.rank = r;
        p.host.assign(rec, strnlen(rec, kHost));
        p.device.assign(rec + kHost, strnlen(rec + kHost, kDevice));
        IF_CHECK(std::sscanf(rec + kHost + kDevice, "%d %d", &p.local_rank, &p.local_size) == 2,
                 "placement record of rank " << r << " is malformed");
        out.push_back(std::move(p));
    }
    return out;
}

std::string placement_summary(const std::vector<RankPlacement>& placement) {
    std::vector<std::string> hosts;  // in the order of their first rank
    for (const RankPlacement& p : placement) {
        if (std::find(hosts.begin(), hosts.end(), p.host) == hosts.end()) hosts.push_back(p.host);
    }
    std::string s = std::to_string(hosts.size()) + (hosts.size() == 1 ? " host: " : " hosts: ");
    for (size_t h = 0; h < hosts.size(); ++h) {
        std::string ranks, locals;
        int local_size = 0;
        for (const RankPlacement& p : placement) {
            if (p.host != hosts[h]) continue;
            ranks += (ranks.empty() ? "" : ",") + std::to_string(p.rank);
            locals += (locals.empty() ? "" : ",") + std::to_string(p.local_rank);
            local_size = p.local_size;
        }
        s += (h ? "; " : "") + (hosts[h].empty() ? std::string("?") : hosts[h]) + " rank" +
             (ranks.find(',') == std::string::npos ? " " : "s ") + ranks + " (local " + locals +
             " of " + std::to_string(local_size) + ")";
    }
    return s;
}

nlohmann::json placement_json(const std::vector<RankPlacement>& placement) {
    nlohmann::json out = nlohmann::json::array();
    for (const RankPlacement& p : placement) {
        out.push_back({{"rank", p.rank},
                       {"host", p.host},
                       {"local_rank", p.local_rank},
                       {"local_size", p.local_size},
                       {"device", p.device}});
    }
    return out;
}

std::string devices_summary(const std::vector<std::string>& devices) {
    if (devices.empty()) return "?";
    bool same = true;
    for (const std::string& d : devices) same = same && d == devices[0];
    if (same) return devices[0];
    std::string s;
    for (size_t r = 0; r < devices.size(); ++r) {
        s += (r ? ", rank " : "rank ") + std::to_string(r) + ": " + devices[r];
    }
    return s;
}

}  // namespace infoflow
