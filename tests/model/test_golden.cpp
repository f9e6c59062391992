// Golden tests: stories260K.bin + tok512.bin against the outputs of llama2.c's own `run`
// (/work/shared/reference): stdout byte for byte, greedy and seeded top-p, on 1..8 devices; the
// first logits to 1e-4.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "distributed/runtime.h"
#include "engine/generate.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "reference_files.h"
#include "reference_forward.h"
#include "support/reference_generate.h"

using namespace tpcli::model;
using namespace tpcli::testing;
using namespace tpcli::engine;
using namespace tpcli::formats;
using namespace tpcli::text;

namespace {

struct LogitsAt {
  int pos = 0, token = 0;
  std::vector<float> logits;  // [V]
};

std::vector<LogitsAt> read_reference_logits() {
  std::ifstream in(shared_path("reference/stories260K_logits.txt"));
  std::vector<LogitsAt> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("FULL pos=", 0) != 0) continue;
    LogitsAt l;
    std::sscanf(line.c_str(), "FULL pos=%d in=%d:", &l.pos, &l.token);
    std::istringstream values(line.substr(line.find(':') + 1));
    float v;
    while (values >> v) l.logits.push_back(v);
    out.push_back(std::move(l));
  }
  return out;
}

GenerateOptions options_of(const RunCase& c, int seq_len) {
  GenerateOptions o;
  o.prompt = c.prompt;
  o.steps = c.steps;
  o.temperature = c.temperature;
  o.topp = c.topp;
  o.seed = c.seed ? c.seed : 1;  // greedy cases draw no randomness
  return normalized(o, seq_len);
}

double max_abs_diff(std::span<const float> a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

}  // namespace

TEST_CASE("golden: llama2.c's forward + our generate/sampler/tokenizer reproduce run's stdout", "[golden]") {
  TPCLI_REQUIRE_SHARED("reference/llama2c_stories260K.tsv");
  Llama2cFile weights(shared_path("data/stories260K.bin"));
  Tokenizer tok(shared_path("data/tok512.bin"), 512);
  for (const auto& c : read_run_cases()) {
    INFO(c.name);
    ReferenceForward ref(weights);
    const auto r = reference_generate(ModelFns{[&](int t, int p) { return ref.forward(t, p); }}, tok, options_of(c, 512), nullptr);
    CHECK(r.text == c.stdout_text);
    CHECK(r.tokens == c.token_ids);
  }
}

TEST_CASE("golden: llama2.c's forward (transcribed) matches the reference logits", "[golden]") {
  TPCLI_REQUIRE_SHARED("reference/stories260K_logits.txt");
  Llama2cFile weights(shared_path("data/stories260K.bin"));
  const auto expected = read_reference_logits();
  REQUIRE(expected.size() == 5);
  ReferenceForward ref(weights);
  for (const auto& e : expected) {
    INFO("pos " << e.pos);
    CHECK(max_abs_diff(ref.forward(e.token, e.pos), e.logits) < 1e-4);
  }
}

TEST_CASE("golden: the sharded model's logits match llama2.c on 1..8 devices", "[golden][sharded]") {
  TPCLI_REQUIRE_SHARED("reference/stories260K_logits.txt");
  Llama2cFile weights(shared_path("data/stories260K.bin"));
  const auto expected = read_reference_logits();
  REQUIRE(expected.size() == 5);
  for (int devices = 1; devices <= 8; ++devices) {
    std::vector<double> worst(static_cast<size_t>(devices), 1e9);  // [devices]
    tpcli::dist::run_on_mesh(tpcli::dist::Mesh::line(devices), [&](tpcli::dist::Device& dev) {
      Llama model(weights, dev.axis("model"));
      double m = 0;
      for (const auto& e : expected) m = std::max(m, max_abs_diff(model.forward(e.token, e.pos), e.logits));
      worst[static_cast<size_t>(dev.rank())] = m;
    });
    for (int d = 0; d < devices; ++d) {
      INFO(devices << " devices, device " << d);
      CHECK(worst[static_cast<size_t>(d)] < 1e-4);
    }
  }
}

TEST_CASE("golden: stdout of every reference case, byte for byte, on 1..8 devices", "[golden][sharded]") {
  TPCLI_REQUIRE_SHARED("reference/llama2c_stories260K.tsv");
  Llama2cFile weights(shared_path("data/stories260K.bin"));
  Tokenizer tok(shared_path("data/tok512.bin"), 512);
  const auto cases = read_run_cases();
  REQUIRE(cases.size() >= 4);
  for (int devices = 1; devices <= 8; ++devices) {
    for (const auto& c : cases) {
      INFO(devices << " devices, case " << c.name);
      const auto r = generate_on_mesh(weights, tok, tpcli::dist::Mesh::line(devices), options_of(c, 512), nullptr);
      CHECK(r.result.text == c.stdout_text);
      CHECK(r.result.tokens == c.token_ids);
      REQUIRE(r.devices.size() == static_cast<size_t>(devices));
      if (devices > 1) CHECK(r.devices[0].bytes_moved > 0);
    }
  }
}

TEST_CASE("golden: more devices than heads is a clear error", "[golden][sharded]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  Llama2cFile weights(shared_path("data/stories260K.bin"));
  Tokenizer tok(shared_path("data/tok512.bin"), 512);
  GenerateOptions o = normalized({"", 4, 0.0f, 0.9f, 1}, 512);
  CHECK_THROWS_AS(generate_on_mesh(weights, tok, tpcli::dist::Mesh::line(9), o, nullptr), std::invalid_argument);
}

namespace {

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// stdout of the tpcli binary (stderr discarded); empty on a non-zero exit.
std::string tpcli_stdout(const std::string& args) {
  const std::string out = (std::filesystem::temp_directory_path() / ("tpcli_golden_" + std::to_string(::getpid()))).string();
  const int status = std::system((std::string(TPCLI_BINARY) + " " + args + " >" + out + " 2>/dev/null").c_str());
  std::string text = status == 0 ? read_file_bytes(out) : "";
  std::filesystem::remove(out);
  return text;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string run_flags(const RunCase& c) {
  std::ostringstream f;
  f << " -t " << c.temperature << " -p " << c.topp << " -n " << c.steps << " -i " << shell_quote(c.prompt);
  if (c.seed) f << " -s " << c.seed;
  return f.str();
}

}  // namespace

TEST_CASE("golden: tpcli infer prints run's stdout exactly (llama2.c .bin and safetensors)", "[golden][cli]") {
  TPCLI_REQUIRE_SHARED("reference/llama2c_stories260K.tsv");
  const std::string model = shared_path("data/stories260K.bin"), tok = shared_path("data/tok512.bin");
  const auto cases = read_run_cases();
  // A safetensors copy recording its tokenizer: -z becomes optional.
  const std::string st = (std::filesystem::temp_directory_path() /
                          ("tpcli_golden_" + std::to_string(::getpid()) + ".safetensors")).string();
  write_safetensors(st, Llama2cFile(model), {{"tokenizer.kind", "llama2c"}, {"tokenizer", tok}});
  const int device_counts[] = {1, 4, 7, 2, 5, 3, 8, 6};
  for (size_t i = 0; i < cases.size(); ++i) {
    const RunCase& c = cases[i];
    const int devices = device_counts[i % 8];
    INFO(c.name << " on " << devices << " devices");
    CHECK(tpcli_stdout("infer --model " + model + " -z " + tok + " --devices " + std::to_string(devices) + run_flags(c)) ==
          c.stdout_text);
    CHECK(tpcli_stdout("infer --model " + st + " --mesh model=" + std::to_string(9 - devices) + run_flags(c)) ==
          c.stdout_text);
  }
  std::filesystem::remove(st);
}
