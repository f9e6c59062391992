// A tpcli server in the test's process: stories260K (../shared) on N thread devices, on a free
// port of 127.0.0.1, with httplib clients to talk to it.
#pragma once

#include <httplib.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "distributed/runtime.h"
#include "engine/grammar_constraint.h"
#include "formats/llama2c.h"
#include "model/llama.h"
#include "serve/http_server.h"
#include "support/shared_data.h"
#include "text/tokenizer.h"

namespace tpcli::testing {

class LiveServer {
 public:
  // `model`: a llama2.c file of stories260K's shape (a test's altered copy); by default the real one.
  // `chat_template`: zephyr's by default. Requests' grammars compile against tok512.
  explicit LiveServer(int devices, serve::ServiceOptions service = {}, serve::ServerOptions options = {}, const std::string& model = {},
                      std::optional<text::ChatTemplate> chat_template = {})
      : weights_(model.empty() ? shared_path("data/stories260K.bin") : model),
        tokenizer_(shared_path("data/tok512.bin"), weights_.config().vocab_size),
        grammars_(tokenizer_),
        service_(with_grammars(service)) {
    serve::ServedModel m;
    m.name = "stories260K";
    m.tokenizer = &tokenizer_;
    m.chat_template = chat_template ? *chat_template : text::chat_template_named("zephyr");
    m.compile_grammar = [this](const std::string& gbnf) { return grammars_.compile(gbnf); };
    m.chat_tokens = {"<s>", "</s>"};
    m.stop_ids = {2};
    m.devices = devices;
    m.mesh = "model=" + std::to_string(devices);
    options.port = 0;
    http_.emplace(service_, m, options);
    port_ = http_->bind();
    devices_ = std::thread([this, devices] {
      try {
        dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
          model::Llama llama(weights_, dev.axis("model"));
          service_.run_device(llama, dev, tokenizer_);
        });
      } catch (const std::exception& e) {
        service_.fail(e.what());
      }
    });
    listener_ = std::thread([this] { http_->listen(); });
  }
  ~LiveServer() {
    http_->stop();
    service_.shutdown();
    devices_.join();
    listener_.join();
  }
  LiveServer(const LiveServer&) = delete;
  LiveServer& operator=(const LiveServer&) = delete;

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120);
    return c;
  }
  int port() const { return port_; }
  serve::EngineService& service() { return service_; }
  const text::Tokenizer& tokenizer() const { return tokenizer_; }
  const model::WeightSource& weights() const { return weights_; }

 private:
  serve::ServiceOptions with_grammars(serve::ServiceOptions o) {
    if (!o.compile_grammar) o.compile_grammar = [this](const std::string& gbnf) { return grammars_.compile(gbnf); };
    return o;
  }

  formats::Llama2cFile weights_;
  text::Tokenizer tokenizer_;
  engine::GrammarConstraints grammars_;
  serve::EngineService service_;
  std::optional<serve::HttpServer> http_;
  int port_ = 0;
  std::thread devices_, listener_;
};

// A counter or gauge of the server's /metrics, as an integer (std::runtime_error when absent).
inline int metric(httplib::Client& c, const std::string& name) {
  const auto res = c.Get("/metrics");
  const size_t at = res ? res->body.find("\n" + name + " ") : std::string::npos;
  if (at == std::string::npos) throw std::runtime_error("/metrics has no " + name);
  return std::stoi(res->body.substr(at + name.size() + 2));
}

}  // namespace tpcli::testing
