// A dense layer's products by a weight kept in oneDNN's own layout (runtime.pack_weights).
// OpenBLAS packs B on every call; at a pipeline's small microbatches that copy of the
// whole weight is a large part of the product (bench_gemm_libs: at 128 rows the forward
// and input-gradient products take 0.72 of OpenBLAS's time with a reordered weight).
// Here a weight is reordered once per hold (an executor run: no weight changes within
// one) into the blocked layout oneDNN's f32 matmul chooses, and every product of the
// hold reads that copy. The weight gradient stays with sgemm: it writes the plain layout,
// and OpenBLAS is the faster there at every shape measured.
#include "cpu_kernels.hpp"

#include <algorithm>
#include <atomic>

#ifdef PIPETRAIN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include <fmt/format.h>

#include <optional>
#include <unordered_map>
#include <vector>

#include "onednn_matmul.hpp"
#endif

namespace pipetrain {

namespace {
std::atomic<long> packed_products{0};
}  // namespace

long packed_dense_products_run() { return packed_products.load(std::memory_order_relaxed); }

namespace cpu {

#ifdef PIPETRAIN_HAVE_ONEDNN

namespace {

// One product of one weight: the forward (y = x W^T, accumulating into y when it was
// started at bias + residual) or the input gradient (dx = dy W), at one row count.
struct Key {
  const float* w;
  int rows, out, in;
  bool input_gradient, accumulate;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<const void*>{}(k.w);
    for (int v : {k.rows, k.out, k.in, static_cast<int>(k.input_gradient), static_cast<int>(k.accumulate)})
      h = h * 1000003u ^ static_cast<size_t>(v);
    return h;
  }
};

}  // namespace

class PackedDense::Impl {
 public:
  struct Entry {
    dnnl::matmul prim;
    dnnl::memory::desc src, dst, plain;  // plain: W as op(B) in its row-major storage
    dnnl::memory weights;                // W in the primitive's layout
    const float* w = nullptr;            // W itself
    uint64_t hold = 0;                   // the hold whose values `weights` has (0: none yet)
  };

  // The entry for `k`, or nullptr when oneDNN has only its reference implementation for
  // this product (slower than sgemm) or none.
  Entry* get(const Key& k) {
    if (!only_.empty() && std::find(only_.begin(), only_.end(), DenseShape{k.out, k.in}) == only_.end())
      return nullptr;  // a shape the run's choice leaves to the plain product
    auto it = entries_.find(k);
    if (it == entries_.end()) it = entries_.emplace(k, make(k)).first;
    return it->second ? &*it->second : nullptr;
  }

  // C = A op(W) by `e`, the entry of weight `w`.
  void run(Entry& e, const float* a, float* c) {
    if (e.hold != hold_) refresh(e);  // this hold's first product by the weight
    e.prim.execute(stream_, {{DNNL_ARG_SRC, dnnl::memory(e.src, engine_, const_cast<float*>(a))},
                             {DNNL_ARG_WEIGHTS, e.weights},
                             {DNNL_ARG_DST, dnnl::memory(e.dst, engine_, c)}});
    stream_.wait();
    packed_products.fetch_add(1, std::memory_order_relaxed);
  }

  void hold(bool held) {
    held_ = held;
    if (held) {
      ++hold_;
      next_ = 0;
      return;
    }
    // The copies of weights this hold did not multiply by (an evaluation's row count, the
    // unit-cost measurement's) are freed: what stays is two copies of the weights in use,
    // in the order this hold refreshed them, the order the next one refreshes them ahead.
    std::erase_if(entries_, [&](const auto& kv) { return kv.second && kv.second->hold != hold_; });
    last_order_ = std::move(order_);
    order_.clear();
  }
  bool held() const { return held_; }

  // Refreshes, while held, the copies the last hold used that this one has not yet, in
  // the last hold's order (the program's), until `arrived()`; how many.
  int refresh_until(const std::function<bool()>& arrived) {
    int n = 0;
    while (held_ && !arrived()) {
      while (next_ < last_order_.size() && last_order_[next_]->hold == hold_) ++next_;
      if (next_ == last_order_.size()) break;
      refresh(*last_order_[next_]);
      ++n;
    }
    return n;
  }

  void only(std::vector<DenseShape> shapes) { only_ = std::move(shapes); }

  void forget() {
    entries_.clear();
    order_.clear();
    last_order_.clear();
    next_ = 0;
  }

  std::pair<int64_t, size_t> copies() const {
    std::pair<int64_t, size_t> n{0, 0};
    for (const auto& [k, e] : entries_)
      if (e) {
        n.first += static_cast<int64_t>(k.out) * k.in;
        n.second += e->weights.get_desc().get_size();
      }
    return n;
  }

 private:
  std::optional<Entry> make(const Key& k) {
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    // y[rows, out] = x[rows, in] W^T: op(B) = W^T, K = in. dx[rows, in] = dy[rows, out] W: op(B) = W, K = out.
    const int K = k.input_gradient ? k.out : k.in, N = k.input_gradient ? k.in : k.out;
    const dnnl::memory::desc src({k.rows, K}, dt::f32, dims{K, 1});
    const dnnl::memory::desc plain({K, N}, dt::f32, k.input_gradient ? dims{k.in, 1} : dims{1, k.in});
    const dnnl::memory::desc any({K, N}, dt::f32, dnnl::memory::format_tag::any);
    const dnnl::memory::desc dst({k.rows, N}, dt::f32, dims{N, 1});
    dnnl::primitive_attr attr;
    if (k.accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);  // y += x W^T: y was started at bias + residual
      attr.set_post_ops(ops);
    }
    const auto pd = optimized_matmul(dnnl::matmul::desc(src, any, dst), attr, engine_,
                                     fmt::format("the {}x{}x{} product by a packed weight", k.rows, N, K));
    if (!pd) return std::nullopt;  // the caller's sgemm runs it
    return Entry{dnnl::matmul(*pd), src, dst, plain, dnnl::memory(pd->weights_desc(), engine_), k.w, 0};
  }

  // The copy in the layout of `e` gets W's values of this hold.
  void refresh(Entry& e) {
    dnnl::memory plain(e.plain, engine_, const_cast<float*>(e.w));
    dnnl::reorder(plain, e.weights).execute(stream_, plain, e.weights);
    stream_.wait();
    e.hold = hold_;
    order_.push_back(&e);
  }

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::unordered_map<Key, std::optional<Entry>, KeyHash> entries_;  // node-based: an Entry stays put
  std::vector<Entry*> order_, last_order_;  // refreshed in this hold, in the last one
  size_t next_ = 0;                         // the first of last_order_ not looked at in this hold
  std::vector<DenseShape> only_;            // the shapes packed (empty: all)
  uint64_t hold_ = 0;
  bool held_ = false;
};

PackedDense::PackedDense() : impl_(std::make_unique<Impl>()) {}
PackedDense::~PackedDense() = default;

std::unique_ptr<PackedDense> PackedDense::make() {
  auto p = std::unique_ptr<PackedDense>(new PackedDense());
  // A small product of each kind, as a layer would ask for it: an optimized
  // implementation for both, or no packing on this CPU.
  static const float w[64 * 64] = {};
  for (bool input_gradient : {false, true})
    if (!p->impl_->get({w, 64, 64, 64, input_gradient, false})) return nullptr;
  p->impl_->forget();
  return p;
}

void PackedDense::hold(bool held) { impl_->hold(held); }
int PackedDense::refresh_until(const std::function<bool()>& arrived) { return impl_->refresh_until(arrived); }
void PackedDense::forget() { impl_->forget(); }
void PackedDense::only(std::vector<DenseShape> shapes) { impl_->only(std::move(shapes)); }
std::pair<int64_t, size_t> PackedDense::held_copies() const { return impl_->copies(); }

bool PackedDense::forward(int rows, int out, int in, const float* x, const float* w, float* y, const float* bias,
                          const float* residual) {
  if (!impl_->held() || rows <= 0 || out <= 0 || in <= 0) return false;
  const bool accumulate = bias || residual;
  Impl::Entry* e = impl_->get({w, rows, out, in, false, accumulate});
  if (!e) return false;
  if (accumulate) start_rows(y, rows, out, out, bias, residual);
  impl_->run(*e, x, y);
  return true;
}

bool PackedDense::backward_input(int rows, int out, int in, const float* dy, const float* w, float* dx) {
  if (!impl_->held() || rows <= 0 || out <= 0 || in <= 0) return false;
  Impl::Entry* e = impl_->get({w, rows, out, in, true, false});
  if (!e) return false;
  impl_->run(*e, dy, dx);
  return true;
}

#else  // built without oneDNN: no packing (PackedDense::make says so)

class PackedDense::Impl {};
PackedDense::PackedDense() = default;
PackedDense::~PackedDense() = default;
std::unique_ptr<PackedDense> PackedDense::make() { return nullptr; }
void PackedDense::hold(bool) {}
int PackedDense::refresh_until(const std::function<bool()>&) { return 0; }
void PackedDense::forget() {}
void PackedDense::only(std::vector<DenseShape>) {}
std::pair<int64_t, size_t> PackedDense::held_copies() const { return {0, 0}; }
bool PackedDense::forward(int, int, int, const float*, const float*, float*, const float*, const float*) {
  return false;
}
bool PackedDense::backward_input(int, int, int, const float*, const float*, float*) { return false; }

#endif

}  // namespace cpu
}  // namespace pipetrain
