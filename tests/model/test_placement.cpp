// model::Placement: an axis with no role is refused by name, the plans are the shard planner's for
// the axis the roles name, and a model placed on a renamed tensor axis is the model split over
// "model" (the same logits, bit for bit, and the same shard per device).
#include <catch2/catch.hpp>

#include "distributed/runtime.h"
#include "model/llama.h"
#include "model/placement.h"
#include "random_model.h"

using namespace tpcli;

TEST_CASE("placement: every axis longer than 1 needs a role, and the roles name two axes") {
  const model::AxisRoles defaults;
  CHECK_NOTHROW(model::check_axis_roles(dist::Mesh({{"expert", 2}, {"model", 2}}), defaults));
  CHECK_NOTHROW(model::check_axis_roles(dist::Mesh({{"data", 1}, {"model", 4}}), defaults));  // size 1: no work to repeat
  CHECK_THROWS_WITH(model::check_axis_roles(dist::Mesh({{"tp", 4}}), defaults),
                    Catch::Contains("axis 'tp' (size 4) has no role in inference") &&
                        Catch::Contains("the weights split over 'model' and the experts over 'expert'"));
  CHECK_NOTHROW(model::check_axis_roles(dist::Mesh({{"tp", 4}}), {.tensor = "tp"}));
  CHECK_THROWS_WITH(model::check_axis_roles(dist::Mesh({{"tp", 2}}), {.tensor = "tp", .expert = "tp"}),
                    Catch::Contains("the tensor and expert roles name one axis 'tp'"));
}

TEST_CASE("placement: the plans are the planner's over the named tensor axis, and too many devices is the planner's error") {
  const model::LlamaConfig c = testing::make_config(32, 8, 4, 40, 2, 19, false);
  const model::TensorWeights w = testing::random_weights(c, 5);
  const model::Placement p(w, dist::Mesh({{"tp", 4}}), {.tensor = "tp"});
  CHECK(p.tensor_devices() == 4);
  CHECK(p.expert_devices() == 1);
  const auto planned = model::plan_all_shards(c, 4);
  REQUIRE(p.plans().size() == planned.size());
  for (size_t r = 0; r < planned.size(); ++r) {
    CHECK(p.plans()[r].heads.offset == planned[r].heads.offset);
    CHECK(p.plans()[r].heads.count == planned[r].heads.count);
    CHECK(p.plans()[r].ffn.count == planned[r].ffn.count);
    CHECK(p.plans()[r].vocab.count == planned[r].vocab.count);
  }
  CHECK(p.split_invariant() == model::split_invariant(w, 4));
  // With the default roles the axis "tp" splits nothing: one plan, the whole model.
  CHECK(model::Placement(w, dist::Mesh({{"tp", 4}})).plans().size() == 1);
  CHECK_THROWS_WITH(model::Placement(w, dist::Mesh({{"tp", 12}}), {.tensor = "tp"}),
                    Catch::Contains("cannot split 8 heads over 12 devices"));
}

TEST_CASE("placement: a model placed on a renamed tensor axis is the model split over 'model', bit for bit") {
  const model::LlamaConfig c = testing::make_config(32, 8, 4, 40, 2, 19, false);
  const model::TensorWeights w = testing::random_weights(c, 6);
  const std::vector<int> tokens = testing::random_tokens(5, c.vocab_size, 7);
  std::vector<float> by_groups, placed;
  std::vector<int64_t> bytes_by_groups(4), bytes_placed(4);
  dist::run_on_mesh(dist::Mesh::line(4), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis(model::AxisRoles{}.tensor));
    std::vector<float> l = m.prefill_logits(tokens, 0);
    bytes_by_groups[static_cast<size_t>(dev.rank())] = m.parameter_bytes();
    if (dev.rank() == 0) by_groups = std::move(l);
  });
  const model::Placement placement(w, dist::Mesh({{"tp", 4}}), {.tensor = "tp"});
  model::run_placed(w, placement, {}, [&](model::Llama& m, dist::Device& dev) {
    std::vector<float> l = m.prefill_logits(tokens, 0);
    bytes_placed[static_cast<size_t>(dev.rank())] = m.parameter_bytes();
    CHECK(m.tensor_devices() == 4);
    if (dev.rank() == 0) placed = std::move(l);
  });
  REQUIRE(!placed.empty());
  CHECK(placed == by_groups);
  CHECK(bytes_placed == bytes_by_groups);
}
