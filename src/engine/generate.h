// tpcli::engine — llama2.c's `run` (generate mode), byte for byte, as one request of the batch
// engine (engine/batch_engine.h).
//
// encode(prompt, BOS) -> the prompt's positions, then the sampler's picks; stop after `steps`
// positions (counting the prompt, BOS included) or when BOS comes out; every token after the first
// is decoded (leading space stripped after BOS, <0xNN> as its byte) and printed through
// safe_printf; a final newline. run.c feeds the prompt token by token and samples nothing inside
// it; the engine runs it in one step, whose rows keep decode's bits (Llama::step), so the tokens
// and the text are the same. llama2.c's own loop is kept as the tests' oracle
// (tests/support/reference_generate.h).
//
// Dimension legend: V vocab_size.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "distributed/mesh.h"
#include "distributed/runtime.h"
#include "distributed/trace.h"
#include "engine/sampler.h"
#include "model/placement.h"
#include "model/weights.h"
#include "nn/attention.h"
#include "text/tokenizer.h"

namespace tpcli::engine {

}  // namespace tpcli::engine
namespace tpcli::model {
class Llama;
}  // namespace tpcli::model
namespace tpcli::engine {

// Full-vocabulary logits [V] after feeding `token` at position `pos` (the KV cache advances).
using ForwardFn = std::function<std::span<const float>(int token, int pos)>;

struct GenerateOptions {
  std::string prompt;
  int steps = 256;           // positions, prompt included; 0 or > seq_len means seq_len
  float temperature = 1.0f;  // 0 = greedy
  float topp = 0.9f;         // outside (0, 1): plain multinomial sampling
  SamplingParams sampling;   // top_k, min_p, penalties, logit_bias (engine/sampling_params.h)
  uint64_t seed = 0;         // 0 = from the clock (llama2.c: time(NULL))
  int guesses = 0;           // speculation: tokens guessed and checked per step at most (the tokens do not change)
};

// llama2.c's main() overrides: seed <= 0 -> time, temperature < 0 -> 0, topp outside [0, 1] ->
// 0.9, steps < 0 -> 0, steps 0 or > seq_len -> seq_len.
GenerateOptions normalized(GenerateOptions options, int seq_len);

struct GenerateResult {
  std::string text;         // exactly the bytes printed to stdout (final newline included)
  std::vector<int> tokens;  // every token fed at positions 0.. plus the last one picked (BOS first)
  int positions = 0;        // positions run (prompt included)
  // llama2.c's figure: the positions after the first forward call over the time after it. That
  // call is the whole prompt when it is prefilled, so this is the decode rate.
  double tokens_per_second = 0;
  int prefill_tokens = 0;              // prompt positions fed in one batch (0: token by token)
  double prefill_tokens_per_second = 0;
  int64_t steps = 0;                   // forwards run (prompt included)
  int64_t guessed = 0, guessed_right = 0;  // speculation's guesses checked, and those taken
};

// Greedy shortcut: the argmax token after feeding (token, pos), KV cache advanced (first max wins);
// -1 when a logit is not finite (the reference loop then ends the run naming the position).
using ArgmaxFn = std::function<int(int token, int pos)>;
// Batched prefill: tokens at positions pos.. in one pass (KV cache filled); the last position's
// logits [V], or its argmax token.
using PrefillFn = std::function<std::span<const float>(std::span<const int> tokens, int pos)>;
using PrefillArgmaxFn = std::function<int(std::span<const int> tokens, int pos)>;

// A device's model for generation: `llama`, which generation runs on (a batch engine over it), with
// its device's trace (a span per engine step, on track `track`). The functions are its entry
// points one call at a time, for the tests' reference loop (tests/support/reference_generate.h):
// forward; argmax, greedy without gathering the logits; prefill, the prompt in one batch.
struct ModelFns {
  ForwardFn forward;
  ArgmaxFn argmax;
  PrefillFn prefill;
  PrefillArgmaxFn prefill_argmax;  // used only with argmax, for greedy runs
  model::Llama* llama = nullptr;
  dist::Trace* trace = nullptr;
  int track = 0;
};

// Sees each token as it is appended to GenerateResult::tokens (`next`, forced inside the prompt,
// picked after it) with the token fed before it; returns false to end the run there.
using NextTokenFn = std::function<bool(int token, int next)>;
// One prompt's run from token ids, as one request of a batch engine over model.llama (required):
// prompt[P] fed exactly as given (nothing added, 0 <= id < vocab, P >= 1; the first min(P, steps)
// in one engine step), on_next seeing prompt[1..] as forced picks and then the sampler's picks
// (the request's sampler: options.temperature, topp, seed), until options.steps positions have
// run (prompt included: steps - P + 1 picks; none when steps < P), the context ends or `on_next`
// says stop (null: never). options.prompt is not read; GenerateResult::text stays empty.
// Throws std::runtime_error naming the position when the logits a pick comes from are not finite.
GenerateResult generate_from_ids(const ModelFns& model, std::span<const int> prompt, int vocab,
                                 const GenerateOptions& options, const NextTokenFn& on_next = nullptr);
// generate_from_ids with its model and options bound: the text functions below run over any such
// run (the tests pass llama2.c's own loop).
using IdsRun = std::function<GenerateResult(std::span<const int> prompt, const NextTokenFn& on_next)>;

// run.c's text over `run`: encode(prompt, BOS), the pieces of every token after the first until
// BOS, a final newline. `out` (may be null) receives the text as it is produced, flushed per token
// like run.c.
GenerateResult llama2c_text(const IdsRun& run, const text::Tokenizer& tokenizer, const std::string& prompt, std::FILE* out);
// llama2c_text over generate_from_ids. The options must be normalized already.
GenerateResult generate(const ModelFns& model, const text::Tokenizer& tokenizer, const GenerateOptions& options,
                        std::FILE* out);

// What one device of a mesh run reports.
struct DeviceReport {
  int64_t parameter_bytes = 0;  // this device's shard of the weights
  int64_t kv_cache_bytes = 0;   // this device's KV cache
  uint64_t bytes_moved = 0;     // sent + received through collectives during generation
};

struct MeshGenerateResult {
  GenerateResult result;               // device 0's (every device's is checked to be identical)
  std::vector<DeviceReport> devices;   // by mesh rank
};

// One device's generation loop, given its model's entry points; returns its GenerateResult.
// `out` is the stream for device 0 and null for the others.
using DeviceLoop = std::function<GenerateResult(const ModelFns& model, std::FILE* out)>;

// Runs `loop` on every device of `placement`'s mesh, each with its shard of `weights` where the
// placement puts it. Every device must pick the same tokens (checked: std::logic_error otherwise).
// Throws dist::DeviceError for failures inside a device. kv_dtype: the models' KV caches.
MeshGenerateResult run_model_on_mesh(const model::WeightSource& weights, const model::Placement& placement, const DeviceLoop& loop,
                                     std::FILE* out, const dist::RunOptions& run_options = {},
                                     nn::KvDtype kv_dtype = nn::KvDtype::F32);
// The same on `mesh` with the default roles (Placement(weights, mesh)): std::invalid_argument when
// the tensor axis does not fit the model (more devices than heads).
MeshGenerateResult run_model_on_mesh(const model::WeightSource& weights, const dist::Mesh& mesh, const DeviceLoop& loop,
                               std::FILE* out, const dist::RunOptions& run_options = {},
                               nn::KvDtype kv_dtype = nn::KvDtype::F32);

// llama2.c's generation on a mesh: run_model_on_mesh with generate(); the same sampler state on every
// device, so the same tokens; device 0 writes to `out`.
MeshGenerateResult generate_on_mesh(const model::WeightSource& weights, const text::Tokenizer& tokenizer, const model::Placement& placement,
                                    const GenerateOptions& options, std::FILE* out,
                                    const dist::RunOptions& run_options = {}, nn::KvDtype kv_dtype = nn::KvDtype::F32);
MeshGenerateResult generate_on_mesh(const model::WeightSource& weights, const text::Tokenizer& tokenizer, const dist::Mesh& mesh,
                                    const GenerateOptions& options, std::FILE* out,
                                    const dist::RunOptions& run_options = {}, nn::KvDtype kv_dtype = nn::KvDtype::F32);

}  // namespace tpcli::engine
