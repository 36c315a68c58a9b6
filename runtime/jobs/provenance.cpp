#include "runtime/jobs/provenance.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "runtime/core/build_info.h"
#include "runtime/core/error.h"
#include "runtime/core/fs.h"

namespace infoflow {
namespace {

using json = nlohmann::json;

constexpr uint64_t k_hash_budget = 256ull << 20;  // bytes of content hashed per model

// Hashes up to `budget` bytes of `path` into `h`; returns the bytes hashed.
uint64_t hash_file_prefix(const std::string& path, uint64_t budget, uint64_t& h) {
    std::ifstream f(path, std::ios::binary);
    IF_CHECK(f.good(), "cannot read model file '" << path << "'");
    std::vector<char> buf(1 << 20);
    uint64_t done = 0;
    while (done < budget && f) {
        const std::streamsize want = std::streamsize(std::min<uint64_t>(buf.size(), budget - done));
        f.read(buf.data(), want);
        const std::streamsize got = f.gcount();
        if (got <= 0) break;
        h = fnv1a64(std::string_view(buf.data(), size_t(got)), h);
        done += uint64_t(got);
    }
    return done;
}

std::string base_name(const std::string& p) {
    std::string s = p;
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    const size_t slash = s.find_last_of('/');
    return slash == std::string::npos ? s : s.substr(slash + 1);
}

// "model name" of the first processor, and the SIMD flags that matter to the CPU kernels.
json cpu_json() {
    std::ifstream f("/proc/cpuinfo");
    std::string line, model, flags;
    while (std::getline(f, line)) {
        auto value = [&] {
            const size_t c = line.find(':');
            return c == std::string::npos ? std::string() : line.substr(c + 2);
        };
        if (model.empty() && line.rfind("model name", 0) == 0) model = value();
        if (flags.empty() && line.rfind("flags", 0) == 0) flags = value();
        if (!model.empty() && !flags.empty()) break;
    }
    static const char* k_interesting[] = {"sse4_2",      "avx",         "avx2",     "fma",
                                          "f16c",        "avx512f",     "avx512bw", "avx512vl",
                                          "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
                                          "amx_tile",    "asimd",       "sve"};
    std::vector<std::string> have;
    std::istringstream words(flags);
    std::vector<std::string> all;
    for (std::string w; words >> w;) all.push_back(w);
    for (const char* k : k_interesting) {
        if (std::find(all.begin(), all.end(), k) != all.end()) have.push_back(k);
    }
    // isa: the kernel path this run uses (cpu.isa, kernels/cpu/cpu_features.h); products: the
    // kernels its matrix products run on.
    return {{"model", model.empty() ? json(nullptr) : json(model)},
            {"flags", have},
            {"isa", cpu::cpu_isa_summary()},
            {"products", cpu::cpu_products_summary()}};
}

}  // namespace

std::string utc_now_iso8601() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

json model_identity(const std::string& path) {
    json j;
    j["path"] = path;
    uint64_t h = k_fnv1a64_offset;
    if (path.rfind("random:", 0) == 0) {
        j["file"] = path;
        j["bytes"] = 0;
        j["hash"] = "fnv1a64:" + hex64(fnv1a64(path));
        j["hash_scope"] = "name";
        return j;
    }
    struct stat st {};
    IF_CHECK(::stat(path.c_str(), &st) == 0, "model.path '" << path << "' does not exist");
    j["file"] = base_name(path);
    uint64_t bytes = 0, hashed = 0;
    if (S_ISDIR(st.st_mode)) {
        std::vector<std::string> names;
        if (DIR* d = ::opendir(path.c_str())) {
            while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
            ::closedir(d);
        }
        std::sort(names.begin(), names.end());
        for (const auto& n : names) {
            const std::string p = path + "/" + n;
            struct stat fs {};
            if (n[0] == '.' || ::stat(p.c_str(), &fs) != 0 || !S_ISREG(fs.st_mode)) continue;
            bytes += uint64_t(fs.st_size);
            h = fnv1a64(n + ":" + std::to_string(fs.st_size) + ";", h);
            hashed += hash_file_prefix(p, k_hash_budget - std::min(hashed, k_hash_budget), h);
        }
    } else {
        bytes = uint64_t(st.st_size);
        h = fnv1a64(std::to_string(bytes) + ";", h);
        hashed = hash_file_prefix(path, k_hash_budget, h);
    }
    j["bytes"] = bytes;
    j["hash"] = "fnv1a64:" + hex64(h);
    j["hash_scope"] = hashed >= bytes ? "whole" : "first " + std::to_string(hashed >> 20) + " MiB";
    return j;
}

json provenance_json(const Config& cfg, int ranks, int threads_per_rank,
                     const std::string& start_time) {
    const BuildInfo& b = build_info();
    auto words = [](const char* s) {
        std::vector<std::string> out;
        std::istringstream in(s);
        for (std::string w; in >> w;) out.push_back(w);
        return out;
    };
    char host[256] = {0};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    struct utsname u {};
    const bool have_uname = ::uname(&u) == 0;
    const unsigned hw = std::thread::hardware_concurrency();
    json p;
    p["tool"] = {{"name", "infoflow_sp"},
                 {"version", b.version},
                 {"commit", b.commit},
                 {"features", words(b.features)},
                 {"found_unused", words(b.found_unused)},
                 {"build_type", b.build_type},
                 {"compiler", b.compiler},
                 {"cpu_flags", b.cpu_flags}};
    p["host"] = {{"name", host},
                 {"os", have_uname ? std::string(u.sysname) + " " + u.release : std::string()},
                 {"cpu", cpu_json()},
                 {"hardware_threads", hw}};
    p["ranks"] = ranks;
    p["threads_per_rank"] = threads_per_rank > 0 ? threads_per_rank : int(hw);
    p["threads_setting"] = threads_per_rank;
    p["model"] = model_identity(cfg.model.path);
    p["weights"] = to_string(cfg.model.weights);
    p["start_time"] = start_time;
    return p;
}

void add_provenance(json& result, const Config& cfg, int ranks, const std::string& start_time) {
    const int threads = cfg.job == Config::Job::bench_ttft && cfg.bench.threads > 0
                            ? cfg.bench.threads
                            : cfg.model.threads;
    result["schema_version"] = k_result_schema_version;
    result["provenance"] = provenance_json(cfg, ranks, threads, start_time);
}

}  // namespace infoflow
