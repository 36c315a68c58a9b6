// The OpenAI API layer of job serve without a model (runtime/serve): request parsing and its
// errors, the text streamer (stop strings, UTF-8), the key comparison, the task queue and the
// Prometheus rendering. The server end to end is tests/serve/serve_test.py.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/serve/api.h"
#include "runtime/serve/metrics.h"
#include "runtime/serve/task.h"

using namespace infoflow::serve;
using nlohmann::json;

namespace {

CompletionRequest chat(const json& body, Limits lim = {}) {
    return parse_completion_request(Endpoint::chat, body.dump(), lim);
}

// The ApiError a body gets (status 0 when it parses).
ApiError error_of(Endpoint e, const std::string& body, Limits lim = {}) {
    try {
        parse_completion_request(e, body, lim);
    } catch (const ApiError& err) {
        return err;
    }
    return ApiError(0, "parsed");
}

const json k_msgs = json::array({{{"role", "user"}, {"content", "Q?"}}});

}  // namespace

TEST_CASE("a chat request parses into its fields", "[cpu][serve]") {
    const CompletionRequest r =
        chat({{"model", "m"},
              {"messages",
               json::array({{{"role", "system"}, {"content", "S"}},
                            {{"role", "user"},
                             {"content", json::array({{{"type", "text"}, {"text", "a"}},
                                                      {{"type", "text"}, {"text", "b"}}})}}})},
              {"max_completion_tokens", 7},
              {"temperature", 0.5},
              {"top_p", 0.9},
              {"seed", 42},
              {"stop", "END"},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}},
              {"logit_bias", {{"2", -100}}},
              {"documents", {"d1", {{"text", "d2"}}}},
              {"infoflow", {{"method", "full"}, {"ratio", 0.3}, {"exchange", "exact"}}},
              {"user", "ignored"},
              {"n", 1}});
    CHECK(r.model == "m");
    REQUIRE(r.messages.size() == 2);
    CHECK(r.messages[1].content == "ab");
    CHECK(*r.max_tokens == 7);
    CHECK(*r.temperature == 0.5);
    CHECK(*r.top_p == 0.9);
    CHECK(*r.seed == 42);
    CHECK(r.stop == std::vector<std::string>{"END"});
    CHECK(r.stream);
    CHECK(r.include_usage);
    REQUIRE(r.logit_bias.size() == 1);
    CHECK(r.logit_bias[0] == std::pair<int32_t, float>(2, -100.0f));
    CHECK(r.documents == std::vector<std::string>{"d1", "d2"});
    CHECK(*r.method == "full");
    CHECK(*r.ratio == 0.3);
    CHECK(*r.exchange == "exact");
    // Absent and null optional fields stay unset (the server's config decides).
    const CompletionRequest d = chat({{"messages", k_msgs}, {"temperature", nullptr}});
    CHECK_FALSE(d.max_tokens);
    CHECK_FALSE(d.temperature);
    CHECK_FALSE(d.stream);
}

TEST_CASE("bad requests get 400 naming the field", "[cpu][serve]") {
    struct Case {
        json body;
        std::string param;
    };
    const Case cases[] = {
        {{{"max_tokens", 3}}, "messages"},
        {{{"messages", json::array()}}, "messages"},
        {{{"messages", json::array({{{"role", "user"}}})}}, "messages[0].content"},
        {{{"messages", json::array({{{"role", "robot"}, {"content", "x"}}})}}, "messages[0].role"},
        {{{"messages", json::array({{{"role", "user"}, {"content", "x"}},
                                    {{"role", "system"}, {"content", "x"}}})}},
         "messages[1].role"},
        {{{"messages", k_msgs}, {"max_tokens", 0}}, "max_tokens"},
        {{{"messages", k_msgs}, {"max_tokens", -3}}, "max_tokens"},
        {{{"messages", k_msgs}, {"max_tokens", 1.5}}, "max_tokens"},
        {{{"messages", k_msgs}, {"max_tokens", 2000}}, "max_tokens"},
        {{{"messages", k_msgs}, {"max_tokens", 5}, {"max_completion_tokens", 6}},
         "max_completion_tokens"},
        {{{"messages", k_msgs}, {"temperature", "hot"}}, "temperature"},
        {{{"messages", k_msgs}, {"temperature", 2.5}}, "temperature"},
        {{{"messages", k_msgs}, {"top_p", 0}}, "top_p"},
        {{{"messages", k_msgs}, {"seed", 1.5}}, "seed"},
        {{{"messages", k_msgs}, {"stop", {"a", ""}}}, "stop[1]"},
        {{{"messages", k_msgs}, {"stop", {"a", "b", "c", "d", "e"}}}, "stop"},
        {{{"messages", k_msgs}, {"stream", 1}}, "stream"},
        {{{"messages", k_msgs}, {"logit_bias", {{"x", 1}}}}, "logit_bias.x"},
        {{{"messages", k_msgs}, {"logit_bias", {{"5", 101}}}}, "logit_bias.5"},
        {{{"messages", k_msgs}, {"documents", "one"}}, "documents"},
        {{{"messages", k_msgs}, {"documents", {" \n"}}}, "documents[0]"},
        {{{"messages", k_msgs}, {"infoflow", {{"method", "magic"}}}}, "infoflow.method"},
        {{{"messages", k_msgs}, {"infoflow", {{"ratio", -0.1}}}}, "infoflow.ratio"},
        {{{"messages", k_msgs}, {"infoflow", {{"exchange", "ring"}}}}, "infoflow.exchange"},
        {{{"messages", k_msgs}, {"infoflow", {{"speed", 1}}}}, "infoflow.speed"},
        {{{"messages", k_msgs}, {"n", 3}}, "n"},
        {{{"messages", k_msgs}, {"logprobs", true}}, "logprobs"},
        {{{"messages", k_msgs}, {"tools", {{{"type", "function"}}}}}, "tools"},
        {{{"messages", k_msgs}, {"presence_penalty", 0.5}}, "presence_penalty"},
    };
    for (const Case& c : cases) {
        INFO("body " << c.body.dump());
        const ApiError e = error_of(Endpoint::chat, c.body.dump());
        CHECK(e.status == 400);
        CHECK(e.param == c.param);
        CHECK(std::string(e.what()).rfind(c.param + ": ", 0) == 0);  // the message starts with it
        CHECK(e.to_json()["error"]["param"] == c.param);
    }
    // Completions: the prompt.
    CHECK(error_of(Endpoint::completion, R"({"prompt": 5})").param == "prompt");
    CHECK(error_of(Endpoint::completion, R"({"prompt": ["a", "b"]})").code == "not_implemented");
    CHECK(error_of(Endpoint::completion, R"({"prompt": "x", "echo": true})").param == "echo");
}

TEST_CASE("malformed JSON names the byte and the field being read", "[cpu][serve]") {
    const ApiError cut =
        error_of(Endpoint::chat, R"({"messages": [{"role": "user", "content": "ab)");
    CHECK(cut.status == 400);
    CHECK(cut.code == "invalid_json");
    CHECK(cut.param == "messages[0].content");
    const ApiError utf8 = error_of(
        Endpoint::chat,
        std::string("{\"messages\": [{\"role\": \"user\", \"content\": \"") + "\xC3\x28" + "\"}]}");
    CHECK(utf8.param == "messages[0].content");
    CHECK(std::string(utf8.what()).find("UTF-8") != std::string::npos);
    // The error object itself is valid JSON even though the input's bytes are not UTF-8.
    CHECK_NOTHROW(json::parse(dump_json(utf8.to_json())));
    const ApiError second =
        error_of(Endpoint::chat, R"({"messages": [{"role": "user", "content": "a"}, {"role": 5 )");
    CHECK(second.param == "messages[1].role");
    CHECK(error_of(Endpoint::chat, "").code == "invalid_json");
    CHECK(error_of(Endpoint::chat, "[1]").code == "invalid_type");
}

TEST_CASE("the text streamer holds back possible stop strings and split UTF-8", "[cpu][serve]") {
    SECTION("a stop string across tokens ends the text before it") {
        TextStreamer s({"END"});
        CHECK(s.update("Hello E") == "Hello ");  // "E" may begin "END"
        CHECK(s.update("Hello EN") == "");
        CHECK(s.update("Hello ENX") == "ENX");  // it did not
        CHECK(s.update("Hello ENX and END more") == " and ");
        CHECK(s.stop_hit());
        CHECK(s.finish() == "");
        CHECK(s.sent() == "Hello ENX and ");
    }
    SECTION("without stop strings everything goes out, UTF-8 sequences whole") {
        TextStreamer s({});
        const std::string e_acute = "\xC3\xA9";
        CHECK(s.update("caf\xC3") == "caf");  // the first byte of é
        CHECK(s.update("caf" + e_acute) == e_acute);
        CHECK(s.update("caf" + e_acute + "!") == "!");
        CHECK_FALSE(s.stop_hit());
        CHECK(s.finish() == "");
    }
    SECTION("the held-back tail is sent at the end") {
        TextStreamer s({"###"});
        CHECK(s.update("a #") == "a ");
        CHECK(s.finish() == "#");
        CHECK(s.sent() == "a #");
    }
    SECTION("the earliest of several stop strings wins") {
        TextStreamer s({"zz", "b"});
        CHECK(s.update("aaazzb") == "aaa");
        CHECK(s.sent() == "aaa");
    }
    CHECK(utf8_complete_prefix("ab") == 2);
    CHECK(utf8_complete_prefix("a\xE2\x82") == 1);      // 2 of the 3 bytes of €
    CHECK(utf8_complete_prefix("a\xE2\x82\xAC") == 4);  // all of them
    CHECK(utf8_complete_prefix("a\xF0\x9F\x98") == 1);
    CHECK(utf8_complete_prefix("\x80") == 1);  // a stray continuation byte is not held
}

TEST_CASE("API keys compare by value", "[cpu][serve]") {
    CHECK(keys_equal("s3cret", "s3cret"));
    CHECK_FALSE(keys_equal("s3cres", "s3cret"));
    CHECK_FALSE(keys_equal("s3cre", "s3cret"));
    CHECK_FALSE(keys_equal("s3crett", "s3cret"));
    CHECK_FALSE(keys_equal("", "s3cret"));
    CHECK_FALSE(keys_equal("", ""));  // no key configured never matches
    CHECK(is_document_key("0123456789abcdef"));
    CHECK_FALSE(is_document_key("0123456789ABCDEF"));
    CHECK_FALSE(is_document_key("0123"));
}

TEST_CASE("the task queue is a bounded FIFO", "[cpu][serve]") {
    TaskQueue q(2);
    auto a = std::make_shared<Task>(Task::Kind::completion, "/a", 10);
    auto b = std::make_shared<Task>(Task::Kind::completion, "/b", 10);
    auto c = std::make_shared<Task>(Task::Kind::completion, "/c", 10);
    CHECK(q.push(a) == TaskQueue::Push::ok);
    CHECK(q.push(b) == TaskQueue::Push::ok);
    CHECK(q.push(c) == TaskQueue::Push::full);
    CHECK(q.depth() == 2);
    CHECK(q.retry_after_s() >= 1);
    CHECK(q.pop(std::chrono::milliseconds(10)) == a);
    CHECK(q.push(c) == TaskQueue::Push::ok);
    const auto rest = q.close();
    CHECK(rest.size() == 2);
    CHECK(rest[0] == b);
    CHECK(q.push(a) == TaskQueue::Push::closed);
    CHECK(q.pop(std::chrono::milliseconds(1)) == nullptr);
    // Events come back in order; nothing after the final one.
    a->send_chunk({{"n", 1}});
    a->finish({{"done", true}});
    a->send_chunk({{"n", 2}});
    CHECK(a->next(std::chrono::milliseconds(1))->body["n"] == 1);
    CHECK(a->next(std::chrono::milliseconds(1))->type == Task::Event::Type::done);
    CHECK_FALSE(a->next(std::chrono::milliseconds(1)));
}

TEST_CASE("metrics render in the Prometheus text format", "[cpu][serve]") {
    Metrics m;
    m.count_request("/v1/chat/completions", 200);
    m.count_request("/v1/chat/completions", 200);
    m.count_request("/v1/chat/completions", 429);
    m.observe_completion(0.03, 0.2, 100, 5);
    m.observe_completion(3.0, 4.0, 100, 7);
    m.count_store(3, 1, 1);
    m.count_bytes("recompute", 10, 20);
    const std::string t = m.render();
    CHECK(t.find("infoflow_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2\n") !=
          std::string::npos);
    CHECK(t.find("infoflow_requests_total{route=\"/v1/chat/completions\",status=\"429\"} 1\n") !=
          std::string::npos);
    // Cumulative buckets: 0.03 s is in le=0.05 and above, 3 s from le=5.
    CHECK(t.find("infoflow_ttft_seconds_bucket{le=\"0.025\"} 0\n") != std::string::npos);
    CHECK(t.find("infoflow_ttft_seconds_bucket{le=\"0.05\"} 1\n") != std::string::npos);
    CHECK(t.find("infoflow_ttft_seconds_bucket{le=\"5\"} 2\n") != std::string::npos);
    CHECK(t.find("infoflow_ttft_seconds_bucket{le=\"+Inf\"} 2\n") != std::string::npos);
    CHECK(t.find("infoflow_ttft_seconds_count 2\n") != std::string::npos);
    CHECK(t.find("infoflow_generated_tokens_total 12\n") != std::string::npos);
    CHECK(t.find("infoflow_store_hits_total 3\n") != std::string::npos);
    CHECK(t.find("infoflow_bytes_moved_total{phase=\"recompute\",direction=\"received\"} 20\n") !=
          std::string::npos);
}

TEST_CASE("responses and stream chunks follow the OpenAI schema", "[cpu][serve]") {
    ResponseHead h{Endpoint::chat, "chatcmpl-1", 123, "m"};
    Usage u{10, 3};
    const json r = completion_response(h, "hi", "stop", u, {{"x", 1}});
    CHECK(r["object"] == "chat.completion");
    CHECK(r["choices"][0]["message"]["content"] == "hi");
    CHECK(r["choices"][0]["finish_reason"] == "stop");
    CHECK(r["usage"]["total_tokens"] == 13);
    CHECK(r["infoflow"]["x"] == 1);
    const json c = stream_chunk(h, "h", true, "");
    CHECK(c["object"] == "chat.completion.chunk");
    CHECK(c["choices"][0]["delta"]["role"] == "assistant");
    CHECK(c["choices"][0]["finish_reason"].is_null());
    const json last = stream_chunk(h, "", false, "length");
    CHECK(last["choices"][0]["delta"] == json::object());
    CHECK(sse_event({{"a", 1}}) == "data: {\"a\":1}\n\n");
    ResponseHead hc{Endpoint::completion, "cmpl-1", 1, "m"};
    CHECK(completion_response(hc, "t", "length", u, nullptr)["choices"][0]["text"] == "t");
    CHECK(stream_usage_chunk(hc, u)["choices"].empty());
}
