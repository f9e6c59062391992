// The real stories260K checkpoint: decode logits on 1..8 devices against llama2.c's own logits
// (../shared/reference/stories260K_logits.txt, positions 0..4 of "Once upon a time").
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dist/runtime.h"
#include "model/llama.h"
#include "model/llama2c.h"

using namespace tpcli;

namespace {

struct Row {
  int pos = 0, token = 0;
  std::vector<float> logits;
};

// Lines "FULL pos=P in=T: l0 l1 ...".
std::vector<Row> read_reference(const std::string& path) {
  std::ifstream in(path);
  std::vector<Row> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("FULL pos=", 0) != 0) continue;
    Row r;
    std::sscanf(line.c_str(), "FULL pos=%d in=%d:", &r.pos, &r.token);
    std::istringstream values(line.substr(line.find(':') + 1));
    float v;
    while (values >> v) r.logits.push_back(v);
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace

TEST_CASE("stories260K decode logits match llama2.c on 1..8 devices", "[llama][stories260K]") {
  const std::string shared = TPCLI_SHARED_DIR;
  const std::string model_path = shared + "/data/stories260K.bin", ref_path = shared + "/reference/stories260K_logits.txt";
  if (!std::filesystem::exists(model_path) || !std::filesystem::exists(ref_path)) {
    WARN("SKIPPED: " << model_path << " or " << ref_path << " is absent");
    return;
  }
  const auto ref = read_reference(ref_path);
  REQUIRE(ref.size() == 5);
  model::Llama2cFile file(model_path);
  for (int T = 1; T <= 8; ++T) {
    std::vector<float> worst(T, 0.0f);
    dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
      model::Llama m(file, dev.axis("model"));
      for (const auto& r : ref) {
        auto logits = m.forward(r.token, r.pos);
        for (size_t i = 0; i < r.logits.size(); ++i)
          worst[dev.rank()] = std::max(worst[dev.rank()], std::abs(logits[i] - r.logits[i]));
      }
    });
    for (int d = 0; d < T; ++d) {
      INFO(T << " devices, device " << d << ": max abs diff " << worst[d]);
      CHECK(worst[d] <= 1e-4f);
    }
  }
}
