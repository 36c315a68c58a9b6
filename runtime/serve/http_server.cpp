// The HTTP routes of job `serve` on cpp-httplib (http_server.h). Every failure, including the
// library's own (malformed request line, oversized headers or body), answers with the OpenAI
// error object; nothing a client sends reaches the ranks before it was parsed and checked.
#include "runtime/serve/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/core/error.h"

namespace infoflow::serve {

using nlohmann::json;

namespace {

constexpr auto k_poll = std::chrono::milliseconds(50);

void send_json(httplib::Response& res, int status, const json& j) {
    res.status = status;
    res.set_content(dump_json(j), "application/json");
}

void send_error(httplib::Response& res, int status, const json& body, int retry_after_s) {
    send_json(res, status, body);
    if (retry_after_s > 0) res.set_header("Retry-After", std::to_string(retry_after_s));
    if (status == 401) res.set_header("WWW-Authenticate", "Bearer");
}

void send_error(httplib::Response& res, const ApiError& e) {
    send_error(res, e.status, e.to_json(), e.retry_after_s);
    // The rest of a body that was not read would be taken for the next request.
    if (e.code == "body_too_large" || e.code == "incomplete_body") {
        res.set_header("Connection", "close");
    }
}

// The body, at most `limit` bytes whatever the framing (a chunked body is counted as it comes;
// a Content-Length above the limit is refused by the library, which sets 413).
std::string read_body(const httplib::ContentReader& reader, size_t limit, httplib::Response& res) {
    std::string body;
    bool too_big = false;
    const bool ok = reader([&](const char* d, size_t n) {
        if (body.size() + n > limit) {
            too_big = true;
            return false;
        }
        body.append(d, n);
        return true;
    });
    if (too_big || (!ok && res.status == 413)) {
        throw ApiError(413,
                       "the request body is larger than this server's limit of " +
                           std::to_string(limit) + " bytes (serve.max_body_bytes)",
                       "", "body_too_large");
    }
    if (!ok) {
        throw ApiError(400,
                       "the request body ended early (fewer bytes than its Content-Length, or a "
                       "broken chunked encoding)",
                       "", "incomplete_body");
    }
    return body;
}

// The route a request is counted under in /metrics.
std::string route_of(const std::string& path) {
    static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/documents",
                                  "/v1/models",           "/health",         "/metrics"};
    for (const char* k : known) {
        if (path == k) return k;
    }
    if (path.rfind("/v1/documents/", 0) == 0) return "/v1/documents/{key}";
    return "other";
}

// What the library's own refusals mean, when no handler wrote a body.
ApiError library_error(int status, size_t max_body) {
    switch (status) {
        case 400:
            return ApiError(400,
                            "malformed HTTP request: bad request line or headers (a header line "
                            "is limited to 8192 bytes)",
                            "", "bad_http_request");
        case 404:
            return ApiError(404, "no such route", "", "not_found");
        case 413:
            return ApiError(413,
                            "the request body is larger than this server's limit of " +
                                std::to_string(max_body) + " bytes (serve.max_body_bytes)",
                            "", "body_too_large");
        case 414:
            return ApiError(414, "the request URI is too long (8192 bytes at most)", "",
                            "uri_too_long");
        default:
            return ApiError(status, "HTTP status " + std::to_string(status));
    }
}

int port_of(const sockaddr_storage& a) {
    return int(ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(a).sin6_port
                                             : reinterpret_cast<const sockaddr_in&>(a).sin_port));
}

std::string address_of(const sockaddr_storage& a) {
    char buf[INET6_ADDRSTRLEN] = {0};
    const void* src =
        a.ss_family == AF_INET6
            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr)
            : static_cast<const void*>(&reinterpret_cast<const sockaddr_in&>(a).sin_addr);
    return ::inet_ntop(a.ss_family, src, buf, sizeof buf) ? std::string(buf) : std::string();
}

// The first of this process's sockets for which `pick(fd)` holds, or -1 (the library hands
// handlers no socket, and keeps its listening one to itself).
template <class Pick>
int find_socket(Pick pick) {
    DIR* d = ::opendir("/proc/self/fd");
    if (d == nullptr) return -1;
    int found = -1;
    while (const dirent* e = ::readdir(d)) {
        const int fd = std::atoi(e->d_name);
        struct stat st {};
        if (fd <= 2 || ::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        if (pick(fd)) {
            found = fd;
            break;
        }
    }
    ::closedir(d);
    return found;
}

// The connection a request came on, as this process's socket: found by its two ends. -1 when
// none matches.
int connection_socket(const httplib::Request& req) {
    return find_socket([&req](int fd) {
        sockaddr_storage local{}, peer{};
        socklen_t ln = sizeof local, pn = sizeof peer;
        return ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ln) == 0 &&
               ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pn) == 0 &&
               port_of(local) == req.local_port && port_of(peer) == req.remote_port &&
               address_of(peer) == req.remote_addr;
    });
}

// The library (compiled: its CPPHTTPLIB_LISTEN_BACKLOG is fixed at 5) listens with room for 5
// connections not yet accepted; a burst of clients connecting at once (16 in the load
// benchmark) overflowed it, and an overflowed handshake can end in a reset. listen() again on
// the bound socket widens the queue (the kernel caps it at net.core.somaxconn). Returns whether
// this process's listening socket on `port` was found.
bool widen_listen_backlog(int port, int backlog) {
    const int fd = find_socket([port](int fd) {
        int listening = 0;
        socklen_t len = sizeof listening;
        sockaddr_storage local{};
        socklen_t ln = sizeof local;
        return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening &&
               ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ln) == 0 &&
               port_of(local) == port;
    });
    return fd >= 0 && ::listen(fd, backlog) == 0;
}

// Whether the client closed its end (or the connection broke): an orderly close reads as EOF.
bool peer_closed(int fd) {
    if (fd < 0) return false;
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
    char c;
    return ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace

bool is_loopback_host(const std::string& host) {
    if (host == "localhost" || host == "::1" || host == "[::1]") return true;
    in_addr a4{};
    if (::inet_pton(AF_INET, host.c_str(), &a4) == 1) {
        return (ntohl(a4.s_addr) >> 24) == 127;
    }
    return false;
}

struct HttpFrontend::Impl {
    Impl(HttpOptions o, ServeBackend& b, TaskQueue& q, Metrics& m, HttpFrontend& f)
        : opt(std::move(o)), backend(b), queue(q), metrics(m), owner(f) {}

    HttpOptions opt;
    ServeBackend& backend;
    TaskQueue& queue;
    Metrics& metrics;
    HttpFrontend& owner;
    httplib::Server svr;
    std::thread thread;
    // Streamed responses not yet fully written: stop() waits for them, since the library ends
    // a stream as soon as it stops listening.
    std::atomic<int> streams{0};

    void enqueue(const std::shared_ptr<Task>& t) {
        switch (queue.push(t)) {
            case TaskQueue::Push::ok:
                metrics.set_queue(queue.depth(), queue.capacity());
                return;
            case TaskQueue::Push::full: {
                ApiError e(429,
                           "the server is busy: " + std::to_string(queue.capacity()) +
                               " requests are already waiting (serve.queue_size); retry later",
                           "", "queue_full");
                e.retry_after_s = queue.retry_after_s();
                throw e;
            }
            case TaskQueue::Push::closed:
                throw ApiError(503, "the server is shutting down", "", "shutting_down");
        }
    }

    // The task's final event (its chunks are skipped: a non-streamed request gets none). A
    // client that closes its connection meanwhile cancels the task (noticed within a poll).
    Task::Event wait_final(Task& t, int fd) {
        for (;;) {
            std::optional<Task::Event> e = t.next(k_poll);
            if (e && e->type != Task::Event::Type::chunk) return *e;
            if (!t.cancelled() && peer_closed(fd)) t.cancel();
        }
    }

    void answer_final(const Task::Event& e, httplib::Response& res) {
        if (e.type == Task::Event::Type::error) {
            send_error(res, e.status, e.body, e.retry_after_s);
        } else {
            send_json(res, e.status, e.body);
        }
    }

    void stream(const std::shared_ptr<Task>& task, int fd, httplib::Response& res) {
        ++streams;
        // The status goes out with the first event: an error before the first token still
        // gets its own status (429s and 400s were answered before queueing). A client that
        // closes its connection meanwhile cancels the task (noticed within a poll).
        std::optional<Task::Event> first;
        while (!first) {
            first = task->next(k_poll);
            if (!first && !task->cancelled() && peer_closed(fd)) task->cancel();
        }
        if (first->type == Task::Event::Type::error) {
            answer_final(*first, res);
            --streams;
            return;
        }
        res.status = 200;
        res.set_header("Cache-Control", "no-cache");
        auto pending = std::make_shared<std::optional<Task::Event>>(std::move(first));
        res.set_chunked_content_provider(
            "text/event-stream",
            [task, pending](size_t, httplib::DataSink& sink) {
                std::optional<Task::Event> e;
                if (*pending) {
                    e = std::move(*pending);
                    pending->reset();
                } else {
                    e = task->next(k_poll);
                }
                if (!e) {
                    // Nothing new: is the client still there? (A closed peer reads as EOF.)
                    if (!sink.is_writable()) {
                        task->cancel();
                        return false;
                    }
                    return true;
                }
                std::string out;
                if (e->type == Task::Event::Type::chunk) {
                    out = sse_event(e->body);
                } else if (e->type == Task::Event::Type::done) {
                    for (const json& c : e->body) out += sse_event(c);
                    out += "data: [DONE]\n\n";
                } else {
                    out = sse_event(e->body);  // the error object; no [DONE]
                }
                if (!sink.write(out.data(), out.size())) {
                    task->cancel();
                    return false;
                }
                if (e->type != Task::Event::Type::chunk) sink.done();
                return true;
            },
            [this](bool) { --streams; });  // the response is written (or abandoned)
    }

    void completion(Endpoint ep, const httplib::Request& req, const httplib::ContentReader& reader,
                    httplib::Response& res) {
        try {
            const std::string body = read_body(reader, opt.max_body_bytes, res);
            CompletionRequest r = parse_completion_request(ep, body, opt.limits);
            const bool streamed = r.stream;
            std::shared_ptr<Task> task = backend.make_completion(std::move(r));
            enqueue(task);
            const int fd = connection_socket(req);
            if (streamed) {
                stream(task, fd, res);
            } else {
                answer_final(wait_final(*task, fd), res);
            }
        } catch (const ApiError& e) {
            send_error(res, e);
        }
    }

    void documents(const httplib::ContentReader& reader, httplib::Response& res) {
        try {
            const std::string body = read_body(reader, opt.max_body_bytes, res);
            std::vector<std::string> docs = parse_documents_request(body, opt.limits);
            std::shared_ptr<Task> task = backend.make_documents(std::move(docs));
            enqueue(task);
            answer_final(wait_final(*task, -1), res);
        } catch (const ApiError& e) {
            send_error(res, e);
        }
    }

    // Before routing: the API key, and 503 while draining. Returns true when it answered.
    bool gate(const httplib::Request& req, httplib::Response& res) {
        if (req.path.rfind("/v1/", 0) != 0) return false;
        if (!opt.api_key.empty()) {
            const std::string auth = req.get_header_value("Authorization");
            const std::string scheme = "Bearer ";
            const bool bearer = auth.size() > scheme.size() &&
                                strncasecmp(auth.c_str(), scheme.c_str(), scheme.size()) == 0;
            if (!bearer || !keys_equal(auth.substr(scheme.size()), opt.api_key)) {
                send_error(res, ApiError(401,
                                         bearer ? "the API key is not valid"
                                                : "an API key is required: send the header "
                                                  "'Authorization: Bearer KEY'",
                                         "", bearer ? "invalid_api_key" : "missing_api_key"));
                return true;
            }
        }
        if (owner.draining() && req.method == "POST") {
            send_error(res, ApiError(503, "the server is shutting down", "", "shutting_down"));
            res.set_header("Connection", "close");
            return true;
        }
        return false;
    }

    void routes() {
        using httplib::ContentReader;
        using httplib::Request;
        using httplib::Response;
        svr.set_pre_routing_handler([this](const Request& req, Response& res) {
            return gate(req, res) ? httplib::Server::HandlerResponse::Handled
                                  : httplib::Server::HandlerResponse::Unhandled;
        });
        svr.Post("/v1/chat/completions",
                 [this](const Request& req, Response& res, const ContentReader& reader) {
                     completion(Endpoint::chat, req, reader, res);
                 });
        svr.Post("/v1/completions",
                 [this](const Request& req, Response& res, const ContentReader& reader) {
                     completion(Endpoint::completion, req, reader, res);
                 });
        svr.Post("/v1/documents", [this](const Request&, Response& res,
                                         const ContentReader& reader) { documents(reader, res); });
        svr.Get(R"(/v1/documents/([^/]*))", [this](const Request& req, Response& res) {
            const std::string key = req.matches[1];
            if (!is_document_key(key)) {
                send_error(res, ApiError(400,
                                         "key: '" + key.substr(0, 64) +
                                             "' is not a document key (16 hex digits, as POST "
                                             "/v1/documents returns them)",
                                         "key", "invalid_key"));
                return;
            }
            try {
                const auto [status, body] = backend.document_status(key);
                send_json(res, status, body);
            } catch (const ApiError& e) {
                send_error(res, e);
            }
        });
        svr.Get("/v1/models",
                [this](const Request&, Response& res) { send_json(res, 200, backend.models()); });
        svr.Get("/health", [this](const Request&, Response& res) {
            auto [status, body] = backend.health();
            if (owner.draining()) {
                status = 503;
                body["status"] = "draining";
            }
            send_json(res, status, body);
        });
        svr.Get("/metrics", [this](const Request&, Response& res) {
            res.set_content(metrics.render(), "text/plain; version=0.0.4");
        });
        // A known route with the wrong method.
        for (const char* p : {"/v1/chat/completions", "/v1/completions"}) {
            svr.Get(p, [](const Request& req, Response& res) {
                send_error(res, ApiError(405, req.path + " takes POST", "", "method_not_allowed"));
                res.set_header("Allow", "POST");
            });
        }
        svr.set_error_handler(
            httplib::Server::HandlerWithResponse([this](const Request&, Response& res) {
                if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
                send_error(res, library_error(res.status, opt.max_body_bytes));
                return httplib::Server::HandlerResponse::Handled;
            }));
        svr.set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
            std::string what = "unknown error";
            try {
                std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                what = e.what();
            } catch (...) {
            }
            send_error(res, ApiError(500, "internal error: " + what, "", "internal_error"));
        });
        svr.set_logger([this](const Request& req, const Response& res) {
            metrics.count_request(route_of(req.path), res.status);
        });
    }
};

HttpFrontend::HttpFrontend(HttpOptions opt, ServeBackend& backend, TaskQueue& queue,
                           Metrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(opt), backend, queue, metrics, *this)) {}

HttpFrontend::~HttpFrontend() { stop(); }

int HttpFrontend::start() {
    Impl& m = *impl_;
    const int threads = m.opt.threads;
    m.svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
    m.svr.set_payload_max_length(m.opt.max_body_bytes);
    m.svr.set_tcp_nodelay(true);
    m.routes();
    int port = m.opt.port;
    if (port == 0) {
        port = m.svr.bind_to_any_port(m.opt.host);
        IF_CHECK(port > 0, "serve.host = '" << m.opt.host << "': cannot listen on any port there: "
                                            << std::strerror(errno));
    } else {
        IF_CHECK(m.svr.bind_to_port(m.opt.host, port),
                 "serve.host:serve.port = " << m.opt.host << ":" << port
                                            << ": cannot listen there (in use, or not an address "
                                               "of this machine): "
                                            << std::strerror(errno));
    }
    if (!widen_listen_backlog(port, 1024)) {
        std::fprintf(stderr, "[serve] warning: the listening socket's queue stays at the HTTP "
                             "library's 5 connections\n");
    }
    m.thread = std::thread([&m] { m.svr.listen_after_bind(); });
    return port;
}

void HttpFrontend::stop() {
    if (!impl_) return;
    if (impl_->thread.joinable()) {
        // The streams in hand finish first (their last events are queued already); a client
        // that stopped reading is given up after the write timeout.
        const auto t0 = std::chrono::steady_clock::now();
        while (impl_->streams.load() > 0 &&
               std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        impl_->svr.stop();
        impl_->thread.join();
    }
}

}  // namespace infoflow::serve
