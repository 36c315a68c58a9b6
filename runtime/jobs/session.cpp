#include "runtime/jobs/session.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
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
    s->load_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return s;
}

std::vector<std::string> gather_devices(Communicator& comm, const Backend& backend) {
    // Fixed-size records: a device name is short; longer ones are cut.
    constexpr size_t kRecord = 128;
    char mine[kRecord] = {};
    const std::string d = backend.device();
    std::memcpy(mine, d.data(), std::min(d.size(), kRecord - 1));
    std::vector<char> all(kRecord * size_t(comm.size()));
    {
        PhaseScope scope(comm, "placement");
        comm.all_gather(mine, kRecord, all.data());
    }
    std::vector<std::string> out;
    for (int r = 0; r < comm.size(); ++r) out.emplace_back(all.data() + size_t(r) * kRecord);
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
