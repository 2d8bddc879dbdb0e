// Generator and sample_token (see pipetrain/runtime/generator.hpp).
#include "pipetrain/runtime/generator.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

int32_t sample_token(std::span<const float> logits, const SamplingOptions& opt, Rng& rng) {
  if (logits.empty()) fail("generation: empty vocabulary");
  if (opt.greedy) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (!(opt.temperature > 0)) fail("--temperature must be positive, got {}", opt.temperature);
  if (!(opt.top_p > 0 && opt.top_p <= 1)) fail("--top-p must be in (0, 1], got {}", opt.top_p);
  // Candidates, most likely first (ties: lower id first).
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (opt.top_k > 0 && static_cast<size_t>(opt.top_k) < ids.size()) ids.resize(static_cast<size_t>(opt.top_k));
  std::vector<double> p(ids.size());
  const double top = logits[static_cast<size_t>(ids.front())];
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) sum += p[i] = std::exp((logits[static_cast<size_t>(ids[i])] - top) / opt.temperature);
  size_t keep = ids.size();
  if (opt.top_p < 1) {
    double cum = 0;
    for (size_t i = 0; i < ids.size(); ++i)
      if ((cum += p[i] / sum) >= opt.top_p) {
        keep = i + 1;
        break;
      }
  }
  const double mass = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  double u = rng.uniform() * mass;
  for (size_t i = 0; i < keep; ++i)
    if ((u -= p[i]) < 0) return ids[i];
  return ids[keep - 1];
}

Generator::Generator(const ModelConfig& cfg, ModelStage& model, Backend& backend, MemoryPool& pool, bool kv_cache,
                     int context)
    : cfg_(cfg),
      model_(model),
      backend_(backend),
      pool_(pool),
      use_cache_(kv_cache),
      context_(std::min(context, cfg.max_seq_len)),
      cache_(pool, kv_cache ? cfg.n_layer : 0, std::min(context, cfg.max_seq_len),
             cfg.family().grouped_kv ? cfg.kv_heads() * (cfg.d_model / cfg.n_head) : cfg.d_model) {
  if (!model.has_embedding() || !model.has_head()) fail("generation needs the whole model on one stage");
  if (context_ < 2) fail("generation: a context of {} tokens is too short", context_);
}

void Generator::reset() {
  cache_.reset();
  sequence_.clear();
}

std::vector<float> Generator::feed(std::span<const int32_t> tokens) {
  if (tokens.empty()) fail("generation: nothing to feed");
  sequence_.insert(sequence_.end(), tokens.begin(), tokens.end());
  if (static_cast<int>(sequence_.size()) > context_)
    fail("generation: {} tokens exceed the context of {}", sequence_.size(), context_);
  // The cached path runs only the new tokens; the other reruns the whole sequence.
  const std::span<const int32_t> run = use_cache_ ? tokens : std::span<const int32_t>(sequence_);
  const int T = static_cast<int>(run.size());
  MicrobatchContext ctx;
  ctx.backend = &backend_;
  ctx.pool = &pool_;
  ctx.B = 1;
  ctx.T = T;
  ctx.loss_scale = 0;  // forward only
  ctx.logits = true;
  ctx.kv = use_cache_ ? &cache_ : nullptr;
  ctx.tokens = Tensor::empty(pool_, {T}, DType::I32);
  backend_.to_device(ctx.tokens.raw(), run.data(), run.size() * sizeof(int32_t));
  Tensor x;
  for (auto& layer : model_.layers()) {
    std::unique_ptr<Stash> stash;
    x = layer->forward(ctx, x, stash);
  }
  if (use_cache_) cache_.advance(T);
  // x: (T, padded vocabulary) logits; the last row's real vocabulary is what comes next.
  const int64_t Vp = x.numel() / T;
  std::vector<float> last(static_cast<size_t>(cfg_.vocab_size));
  backend_.to_host(last.data(), x.f32() + (T - 1) * Vp, last.size() * sizeof(float));
  return last;
}

std::vector<int32_t> Generator::generate(std::span<const int32_t> prompt, int n, const SamplingOptions& opt,
                                         const std::function<bool(int32_t)>& on_token) {
  if (prompt.empty()) fail("generation: the prompt has no tokens");
  reset();
  Rng rng = Rng::for_stream(opt.seed, "generate");
  std::vector<int32_t> out;
  if (static_cast<int>(prompt.size()) > context_) prompt = prompt.subspan(prompt.size() - static_cast<size_t>(context_));
  std::vector<float> logits = feed(prompt);
  for (int i = 0; i < n; ++i) {
    const int32_t next = sample_token(logits, opt, rng);
    out.push_back(next);
    if ((on_token && !on_token(next)) || i + 1 == n) break;
    if (static_cast<int>(sequence_.size()) == context_) {  // full: go on from its last half
      std::vector<int32_t> keep(sequence_.end() - context_ / 2, sequence_.end());
      reset();
      keep.push_back(next);
      logits = feed(keep);
    } else {
      logits = feed(std::span<const int32_t>(&next, 1));
    }
  }
  return out;
}

}  // namespace pipetrain
