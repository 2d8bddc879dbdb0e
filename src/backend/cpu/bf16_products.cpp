#include "pipetrain/backend/bf16_products.hpp"

#include <cstdlib>

#include <fmt/format.h>

#include "cpu_kernels.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {

std::string policy_from_env() {
  const char* v = std::getenv("PIPETRAIN_BF16_GEMM");
  return v ? v : "";
}

}  // namespace

Bf16Products choose_bf16_products(const std::string& policy, bool onednn_usable, bool onednn_native) {
  if (policy.empty() || policy == "auto")
    return onednn_usable && onednn_native ? Bf16Products::kOnednn : Bf16Products::kSgemm;
  if (policy == "sgemm") return Bf16Products::kSgemm;
  if (policy == "onednn") {
    if (!onednn_usable)
      fail("PIPETRAIN_BF16_GEMM=onednn: {}", cpu::onednn_built_in()
                                                 ? "oneDNN cannot run bf16 products on this CPU"
                                                 : "pipetrain was built without oneDNN (install libdnnl-dev and rebuild)");
    return Bf16Products::kOnednn;
  }
  fail("PIPETRAIN_BF16_GEMM={}: expected auto, onednn or sgemm", policy);
}

bool onednn_bf16_usable() { return cpu::onednn_runs_bf16(); }
bool onednn_bf16_native() { return cpu::onednn_runs_bf16() && cpu::onednn_native_bf16(); }

Bf16Products bf16_products() {
  static const Bf16Products path =
      choose_bf16_products(policy_from_env(), onednn_bf16_usable(), onednn_bf16_native());
  return path;
}

std::string bf16_products_summary() {
  const std::string policy = policy_from_env();
  const bool explicit_policy = !policy.empty() && policy != "auto";
  if (bf16_products() == Bf16Products::kOnednn)
    return cpu::onednn_description() + (explicit_policy ? " (PIPETRAIN_BF16_GEMM)" : "");
  const char* why = explicit_policy                ? "PIPETRAIN_BF16_GEMM"
                    : !cpu::onednn_built_in()      ? "built without oneDNN"
                    : !onednn_bf16_usable()        ? "oneDNN cannot run bf16 here"
                                                   : "no bf16 instructions";
  return fmt::format("sgemm on widened operands ({})", why);
}

long onednn_products_run() { return cpu::onednn_products_run(); }

void set_onednn_threads(int n) { cpu::onednn_set_threads(n); }

}  // namespace pipetrain
