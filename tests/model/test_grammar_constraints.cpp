// engine/grammar_constraint.h: a grammar is compiled once while any request holds its constraint,
// however many distinct grammars are in flight (more than the recent ones kept), and once when
// several devices ask for it at the same moment; released, only the most recent stay.
#include <catch2/catch.hpp>

#include <string>
#include <thread>
#include <vector>

#include "engine/grammar_constraint.h"
#include "support/shared_data.h"
#include "text/tokenizer.h"

using namespace tpcli;

namespace {

std::string grammar_number(int i) { return "root ::= \"x" + std::to_string(i) + "\" [a-z ]*\n"; }

// The constraint's first mask: which tokens may open the answer.
std::vector<uint32_t> first_mask(const engine::TokenConstraintFactory& factory, int vocab) {
  std::vector<uint32_t> bits(static_cast<size_t>(vocab + 31) / 32);
  factory()->allowed_tokens(bits);
  return bits;
}

}  // namespace

TEST_CASE("grammar constraints: each of 24 grammars held at once is compiled once, by the HTTP side and two devices alike",
          "[grammar][constraint]") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const text::Tokenizer tokenizer(testing::shared_path("data/tok512.bin"), 512);
  engine::GrammarConstraints grammars(tokenizer);
  constexpr int HELD = 24;
  static_assert(HELD > static_cast<int>(engine::GrammarConstraints::RECENT_GRAMMARS));
  std::vector<engine::TokenConstraintFactory> requests;  // the HTTP side's checks, held by the requests
  for (int i = 0; i < HELD; ++i) requests.push_back(grammars.compile(grammar_number(i)));
  CHECK(grammars.compiled_count() == HELD);

  // Two devices take the same requests at the same step.
  std::vector<std::vector<engine::TokenConstraintFactory>> devices(2);
  std::vector<std::thread> threads;
  for (auto& device : devices)
    threads.emplace_back([&grammars, &device] {
      for (int i = 0; i < HELD; ++i) device.push_back(grammars.compile(grammar_number(i)));
    });
  for (std::thread& t : threads) t.join();
  CHECK(grammars.compiled_count() == HELD);
  for (int i = 0; i < HELD; ++i) {
    INFO("grammar " << i);
    const std::vector<uint32_t> mask = first_mask(requests[static_cast<size_t>(i)], tokenizer.vocab_size());
    CHECK(mask == first_mask(devices[0][static_cast<size_t>(i)], tokenizer.vocab_size()));
    CHECK(mask == first_mask(devices[1][static_cast<size_t>(i)], tokenizer.vocab_size()));
  }

  // A new grammar asked by both devices at once: compiled once.
  std::vector<engine::TokenConstraintFactory> same(2);
  threads.clear();
  for (auto& slot : same) threads.emplace_back([&grammars, &slot] { slot = grammars.compile(grammar_number(HELD)); });
  for (std::thread& t : threads) t.join();
  CHECK(grammars.compiled_count() == HELD + 1);

  // Every request ended: the RECENT_GRAMMARS asked for last stay, the others are compiled again.
  requests.clear();
  devices.clear();
  same.clear();
  const size_t before = grammars.compiled_count();
  for (int i = HELD; i >= 0; --i) grammars.compile(grammar_number(i));  // the most recent first
  CHECK(grammars.compiled_count() == before + (HELD + 1 - engine::GrammarConstraints::RECENT_GRAMMARS));

  CHECK_THROWS_AS(grammars.compile("root ::= undefined-rule"), std::invalid_argument);
  CHECK_THROWS_AS(grammars.compile("root ::= undefined-rule"), std::invalid_argument);  // an error is not kept
}
