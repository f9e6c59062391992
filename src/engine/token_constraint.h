// tpcli::engine — a constraint on what a sequence may generate (a grammar: structured outputs and
// required tool calls), applied by the batch engine to that sequence alone.
//
// Before each token the engine asks which tokens may come next and gives every other token a logit
// of -inf, before the logit_bias, the penalties and the sampler (engine/sampling_params.h); the
// request's stop ids (its end of sequence) may come only when the output so far is whole, and a
// sequence whose output can grow no further ends there (stop). A sequence's constraint is its own:
// its neighbours' logits and tokens keep their bits (batch invariance), and its tokens do not depend
// on them.
//
// Dimension legend: V the model's vocab_size (a mask may cover fewer tokens: the rest are refused).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

namespace tpcli::engine {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // bits[t / 32] bit t % 32 set iff token t may come next; `bits` is zeroed by the caller and holds
  // at least the tokens the constraint knows.
  virtual void allowed_tokens(std::span<uint32_t> bits) const = 0;
  // The token sampled (one allowed_tokens allowed); a stop id never reaches it.
  virtual void accept(int token) = 0;
  virtual bool can_end() const = 0;   // the output so far is a whole answer: a stop id may come
  virtual bool must_end() const = 0;  // ... and no token may extend it
};

// Made once per sequence when it is added (a request is copied; its constraint's state is not).
using TokenConstraintFactory = std::function<std::unique_ptr<TokenConstraint>()>;

}  // namespace tpcli::engine
