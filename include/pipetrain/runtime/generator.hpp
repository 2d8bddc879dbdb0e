// Text generation from a trained model on one rank: the prompt runs through every layer
// once, then each new token runs through them alone, attending over the key/value cache
// (model/kv_cache.hpp) — one row of every product per layer per token. Without the cache
// (for comparison) every token reruns the whole sequence through the training forward.
// The context is the length the model was trained on: when it is full, generation goes
// on from its last half (fed again as a new prompt), in both modes alike.
// Sampling: greedy (argmax, the lowest id among equals), or temperature, then top-k, then
// top-p (the smallest set of most likely tokens whose probability reaches p), drawn from
// a generator seeded by `seed`: the same seed gives the same text.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/core/rng.hpp"
#include "pipetrain/model/kv_cache.hpp"
#include "pipetrain/model/stage.hpp"

namespace pipetrain {

class Backend;

struct SamplingOptions {
  bool greedy = false;
  double temperature = 1.0;  // > 0
  int top_k = 0;             // 0: every token
  double top_p = 1.0;        // (0, 1]
  uint64_t seed = 0;
};

// Picks the next token from `logits` (the model's vocabulary, unpadded).
int32_t sample_token(std::span<const float> logits, const SamplingOptions& opt, Rng& rng);

class Generator {
 public:
  // model: one stage holding every layer (embedding to head) of `cfg`, its weights loaded.
  // context: the most tokens the model sees at once (<= model.max_seq_len; train.seq_len).
  Generator(const ModelConfig& cfg, ModelStage& model, Backend& backend, MemoryPool& pool, bool kv_cache,
            int context);

  // Runs the prompt (at least one token; a longer one keeps its last `context` tokens),
  // then produces up to `n` tokens; on_token(id) sees each as it comes and may return
  // false to stop. Returns the new tokens.
  std::vector<int32_t> generate(std::span<const int32_t> prompt, int n, const SamplingOptions& opt,
                                const std::function<bool(int32_t)>& on_token = {});

  // The logits (unpadded vocabulary) after feeding `tokens` on top of what came before.
  std::vector<float> feed(std::span<const int32_t> tokens);
  void reset();

 private:
  const ModelConfig& cfg_;
  ModelStage& model_;
  Backend& backend_;
  MemoryPool& pool_;
  bool use_cache_;
  int context_;
  KvCache cache_;
  std::vector<int32_t> sequence_;  // everything fed so far (the uncached path reruns it)
};

}  // namespace pipetrain
