// The HTTP side of job serve on rank 0 (docs/serve.md): what the HTTP threads ask of the job
// (serve::ServeBackend) -- a request planned and checked against the model and the KV budget
// before it is queued, the documents of the store, /v1/models and /health -- and the start-up
// steps around it: the API key and the address rule, listening before the model loads, ready.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "runtime/formats/chat_template.h"
#include "runtime/jobs/serve_state.h"

namespace infoflow {

class ApiBackend final : public serve::ServeBackend {
  public:
    explicit ApiBackend(ServeState& st);

    // Before the model is loaded: the API key and the address rule, then listen (/health is
    // 503 until set_ready).
    void listen();
    // After the model is loaded (st.s set): the raw template and the model's name.
    void set_session();
    // Every rank: opening the store once at start-up refuses a missing or foreign store now,
    // not on every request.
    void check_store();
    void set_ready();

    std::shared_ptr<serve::Task> make_completion(serve::CompletionRequest req) override;
    std::shared_ptr<serve::Task> make_documents(std::vector<std::string> docs) override;
    std::pair<int, nlohmann::json> document_status(const std::string& key) override;
    nlohmann::json models() override;
    std::pair<int, nlohmann::json> health() override;

  private:
    std::string resolve_api_key() const;
    void check_ready() const;
    void check_budget(uint64_t need, const std::string& what) const;
    std::string next_id(serve::Endpoint e);

    ServeState& st_;
    std::unique_ptr<ChatTemplate> raw_chat_;
    std::string model_name_;
    std::atomic<uint64_t> request_count_{0};
    uint64_t id_salt_ = 0;
    int64_t created_ = 0;
};

}  // namespace infoflow
