// model/: fixed-order sums across the split (issue 31). wo and w2 add their input columns in lanes
// as a balanced tree that the all_sum continues, so a model on 1, 2, 4 or 8 devices gives the
// same logits byte for byte, prefilled or decoded, in f32, bf16, 8-bit, 4-bit (also with int8
// activations) and mxfp8; a mesh whose split cannot fall on the tree says so (split_invariant).
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "distributed/runtime.h"
#include "formats/llama2c.h"
#include "model/llama.h"
#include "model/packed_weights.h"
#include "random_model.h"
#include "support/shared_data.h"
#include "tensor/packed_matrix.h"

using namespace tpcli;
using namespace tpcli::testing;

namespace {

struct Logits {
  std::vector<float> prefill;  // [P, V]
  std::vector<float> decode;   // [P, V], forward() token by token
  bool split_invariant = false;
};

Logits logits_on(const model::WeightSource& w, int devices, const std::vector<int>& tokens) {
  Logits out;
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    Logits mine{m.prefill_logits(tokens, 0), {}, m.split_invariant()};
    model::Llama fresh(w, dev.axis("model"));
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
      const std::span<const float> l = fresh.forward(tokens[pos], static_cast<int>(pos));
      mine.decode.insert(mine.decode.end(), l.begin(), l.end());
    }
    if (dev.rank() == 0) out = std::move(mine);
  });
  return out;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("split invariance: 1, 2, 4 and 8 devices give the same logits byte for byte in every weight format",
          "[llama][split]") {
  const model::LlamaConfig c = make_config(256, 8, 8, 512, 2, 67, false);  // wo: 8 lanes of a head, w2: 8 of 64 rows
  const model::TensorWeights f32 = random_weights(c, 61);
  const model::ConvertedWeights bf16(f32, tensor::WeightFormat::bf16()), q8(f32, tensor::WeightFormat::affine(8, 32)),
      q4(f32, tensor::WeightFormat::affine(4, 32)), mx(f32, tensor::WeightFormat::mxfp8());
  const std::vector<int> tokens = random_tokens(11, c.vocab_size, 3);
  const std::pair<const char*, const model::WeightSource*> formats[] = {
      {"f32", &f32}, {"bf16", &bf16}, {"8-bit", &q8}, {"4-bit", &q4}, {"mxfp8", &mx}};
  for (const auto& [name, w] : formats) {
    const Logits one = logits_on(*w, 1, tokens);
    for (int devices : {2, 4, 8}) {
      INFO(name << " on " << devices << " devices");
      const Logits many = logits_on(*w, devices, tokens);
      CHECK(many.split_invariant);
      CHECK(same_bytes(many.prefill, one.prefill));
      CHECK(same_bytes(many.decode, one.decode));
    }
    CHECK_FALSE(model::split_invariant(*w, 3));  // 8 heads do not fall on the tree over 3
  }
}

// Each lane of wo and w2 is its own matrix of whole groups, so int8 activations quantize the same
// groups of the same values on any device count, and the lanes' sums keep their fixed tree.
TEST_CASE("split invariance: int8 activations give the same logits on 1, 2, 4 and 8 devices", "[llama][split]") {
  const model::LlamaConfig c = make_config(256, 8, 8, 512, 2, 67, false);
  const model::TensorWeights f32 = random_weights(c, 61);
  const std::vector<int> tokens = random_tokens(11, c.vocab_size, 3);
  struct Int8On {
    Int8On() { tensor::set_int8_activations(true); }
    ~Int8On() { tensor::set_int8_activations(false); }
  } on;
  for (const tensor::WeightFormat& f :
       {tensor::WeightFormat::affine(8, 32), tensor::WeightFormat::affine(4, 32), tensor::WeightFormat::affine(4, 64)}) {
    const model::ConvertedWeights w(f32, f);
    const Logits one = logits_on(w, 1, tokens);
    for (int devices : {2, 4, 8}) {
      if (devices == 8 && f.group_size == 64) continue;  // wo's lanes of 32 columns: not whole groups
      INFO(f.name() << " on " << devices << " devices");
      const Logits many = logits_on(w, devices, tokens);
      CHECK(many.split_invariant);
      CHECK(same_bytes(many.prefill, one.prefill));
      CHECK(same_bytes(many.decode, one.decode));
    }
  }
}

TEST_CASE("split invariance: stories260K gives the same logits on 1, 2 and 4 devices, and says 8 cannot", "[llama][split]") {
  require_shared("data/stories260K.bin");
  const formats::Llama2cFile file(shared_path("data/stories260K.bin"));
  const std::vector<int> tokens = {1, 403, 407, 261, 378, 1, 45, 67, 89, 100};
  const Logits one = logits_on(file, 1, tokens);
  for (int devices : {2, 4}) {
    INFO(devices << " devices");
    const Logits many = logits_on(file, devices, tokens);
    CHECK(many.split_invariant);
    CHECK(same_bytes(many.prefill, one.prefill));
    CHECK(same_bytes(many.decode, one.decode));
  }
  CHECK_FALSE(model::split_invariant(file, 8));  // hidden 172: 4 lanes of 43 rows
}
