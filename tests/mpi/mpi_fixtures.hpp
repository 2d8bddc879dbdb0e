// Shared by the MPI test suites: a tiny GPT-2 run (run_compare.hpp runs and compares it).
#pragma once
#include "run_compare.hpp"

namespace pipetrain::testing {

// The tiny Llama of the long-sequence suites: 4 query heads on 2 key/value heads (one each
// on 2 tp ranks), SwiGLU width 32, rotary base 10000.
inline void make_tiny_llama(Config& c) {
  c.model.arch = "llama";
  c.model.n_head = 4;
  c.model.n_kv_head = 2;
  c.model.ffn_hidden = 32;
  c.model.rope_theta = 10000;
}

// Its blocks as a mixture of experts (after a dense first block): 4 experts of width 16, top
// 2, one shared expert, the load-balancing and z-losses on.
inline void make_tiny_moe(Config& c) {
  c.model.n_experts = 4;
  c.model.top_k = 2;
  c.model.expert_ffn_hidden = 16;
  c.model.n_shared_experts = 1;
  c.model.first_dense = 1;
  c.model.aux_loss_coeff = 0.01;
  c.model.z_loss_coeff = 0.001;
}

inline Config tiny_run_config() {
  Config c;
  c.source = "test";
  c.model.n_layer = 8;
  c.model.n_head = 2;
  c.model.d_model = 16;
  c.model.vocab_size = 50;
  c.model.max_seq_len = 8;
  c.train.seq_len = 8;
  c.train.global_batch = 8;
  c.train.microbatches = 8;
  c.train.lr = 1e-2;
  c.train.lr_schedule = "cosine";
  c.train.warmup_steps = 1;
  c.train.steps = 5;
  c.train.grad_clip = 1.0;
  c.data.train = {"unused"};
  return c;
}

}  // namespace pipetrain::testing
