// Shared helpers for model-level tests: a tiny GPT-2 config, random tensors and a
// learnable token stream.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/rng.hpp"
#include "pipetrain/core/tensor.hpp"
#include "pipetrain/runtime/trainer.hpp"

namespace pipetrain::testing {

inline ModelConfig tiny_model() {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 2;
  m.d_model = 16;
  m.vocab_size = 50;  // padded to 128
  m.max_seq_len = 8;
  return m;
}

inline Tensor random_tensor(MemoryPool& pool, std::vector<int64_t> shape, uint64_t seed,
                            double scale = 1.0) {
  Tensor t = Tensor::empty(pool, std::move(shape));
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(rng.normal() * scale);
  return t;
}

inline Tensor random_tokens(MemoryPool& pool, int n, int vocab, uint64_t seed) {
  Tensor t = Tensor::empty(pool, {n}, DType::I32);
  Rng rng(seed);
  for (int i = 0; i < n; ++i) t.i32()[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
  return t;
}

// A learnable stream: token t of sample s is ((s mod 7) + 3t) mod 50, a deterministic pattern.
inline BatchSource pattern_source(int T) {
  return [T](int64_t first, int count, int32_t* in, int32_t* tgt) {
    for (int k = 0; k < count; ++k)
      for (int t = 0; t <= T; ++t) {
        const auto tok = static_cast<int32_t>(((first + k) % 7 + 3 * t) % 50);
        if (t < T) in[k * T + t] = tok;
        if (t > 0) tgt[k * T + t - 1] = tok;
      }
  };
}

// A tiny GPT-2 trained at a constant lr on 4 sequences of 16 tokens a step.
inline Config tiny_training_config(int microbatches) {
  Config c;
  c.model = tiny_model();
  c.model.max_seq_len = 16;
  c.train.seq_len = 16;
  c.train.global_batch = 4;
  c.train.microbatches = microbatches;
  c.train.steps = 200;
  c.train.lr = 3e-3;
  c.train.lr_schedule = "constant";
  c.train.weight_decay = 0.0;
  c.train.grad_clip = 1.0;
  return c;
}

// The same model trained in `precision` on 8 sequences a step, one a microbatch.
inline Config mixed_precision_config(const std::string& precision) {
  Config c = tiny_training_config(8);
  c.train.global_batch = 8;
  c.train.steps = 100;
  c.train.weight_decay = 0.1;
  c.train.precision = precision;
  return c;
}

inline double dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace pipetrain::testing
