// Loading a model does not keep its checkpoint resident: every tensor a device copies its shard
// of is released from the source (WeightSource::release_pages), and once a mesh run has built its
// devices no page of a llama2.c file's map is in the process's memory (its smaps Rss), while the
// map still reads the file's values.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>

#include "engine/generate.h"
#include "formats/llama2c.h"
#include "model/packed_weights.h"
#include "random_model.h"

using namespace tpcli;
using namespace tpcli::testing;

namespace {

// A source that records which tensors were handed out and which were released (devices are
// threads: one mutex).
class RecordingWeights : public model::WeightSource {
 public:
  explicit RecordingWeights(const model::TensorWeights& inner) : inner_(inner) {}
  const model::LlamaConfig& config() const override { return inner_.config(); }
  std::span<const float> get(const std::string& name) const override {
    std::lock_guard lock(mutex_);
    read_.insert(name);
    return inner_.get(name);
  }
  void release_pages(const std::string& name) const override {
    std::lock_guard lock(mutex_);
    released_.insert(name);
  }
  std::set<std::string> read() const { return read_; }
  std::set<std::string> released() const { return released_; }

 private:
  const model::TensorWeights& inner_;
  mutable std::mutex mutex_;
  mutable std::set<std::string> read_, released_;
};

void build_on_devices(const model::WeightSource& w, int devices) {
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) { model::Llama m(w, dev.axis("model")); });
}

// The Rss (bytes) of the mapping that holds `address`, from /proc/self/smaps.
int64_t resident_bytes_of_mapping(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= a && a < end;
      continue;
    }
    if (inside && line.rfind("Rss:", 0) == 0) return std::stoll(line.substr(4)) * 1024;  // "Rss:   12 kB"
  }
  FAIL("no mapping in /proc/self/smaps holds the address");
  return -1;
}

}  // namespace

TEST_CASE("release_pages: each device releases every tensor it copied from the source", "[weights]") {
  const model::LlamaConfig c = make_config(32, 4, 2, 48, 2, 40, /*shared=*/false);
  const model::TensorWeights w = random_weights(c, 7);
  for (int devices : {1, 2}) {
    RecordingWeights recording(w);
    build_on_devices(recording, devices);
    CHECK(recording.read().size() == model::llama_parameters(c).size());
    CHECK(recording.released() == recording.read());
  }
}

TEST_CASE("release_pages: a conversion to 8-bit on load releases what it packed, the devices the rest", "[weights]") {
  const model::LlamaConfig c = make_config(64, 4, 2, 96, 2, 40, /*shared=*/false);
  const model::TensorWeights w = random_weights(c, 9);
  RecordingWeights recording(w);
  const model::ConvertedWeights converted(recording, tensor::WeightFormat::affine(8, 32));
  build_on_devices(converted, 2);
  CHECK(recording.read().size() == model::llama_parameters(c).size());
  CHECK(recording.released() == recording.read());
}

TEST_CASE("release_pages: after a mesh run built its devices, no page of the llama2.c file is resident", "[weights]") {
  const model::LlamaConfig c = make_config(64, 4, 4, 128, 2, 512, /*shared=*/true);
  const model::TensorWeights w = random_weights(c, 11);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("tpcli_test_release_" + std::to_string(::getpid()) + ".bin")).string();
  formats::write_llama2c(path, w);
  {
    const formats::Llama2cFile file(path);
    const std::span<const float> embeddings = file.get("tok_embeddings");
    float sum = 0;
    for (const auto& p : model::llama_parameters(c))
      for (float v : file.get(p.name)) sum += v;  // every tensor's pages in
    CHECK(sum == sum);
    REQUIRE(resident_bytes_of_mapping(embeddings.data()) > 0);

    engine::run_model_on_mesh(file, dist::Mesh::line(2), [](const engine::ModelFns&, std::FILE*) { return engine::GenerateResult{}; },
                             nullptr);
    CHECK(resident_bytes_of_mapping(embeddings.data()) == 0);
    // Released, not unmapped: the spans read the file again.
    const std::span<const float> expected = w.get("tok_embeddings");
    CHECK(std::equal(embeddings.begin(), embeddings.end(), expected.begin(), expected.end()));
  }
  std::filesystem::remove(path);
}
