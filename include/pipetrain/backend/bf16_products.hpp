// Which library multiplies bf16 operands on the CPU, without the user knowing.
//
// A bf16 product with f32 accumulation (Backend::gemm_bf16, every dense layer's product
// under train.precision = "bf16") has two CPU paths:
//  - oneDNN's matmul, which runs bf16 operands natively on CPUs with AVX512_BF16 or AMX
//    (bench/RESULTS.md: 3.5x the f32 sgemm rate on a Xeon with AMX);
//  - sgemm on the operands widened to f32 (exact: every bf16 is an f32), which any CBLAS
//    runs, at the f32 rate.
// Both form the same exact products and sum them in f32, each in its own order.
//
// PIPETRAIN_BF16_GEMM chooses: `auto` (default: oneDNN when pipetrain was built with it
// and oneDNN runs bf16 natively on this CPU, else sgemm), `onednn` (oneDNN also where it
// emulates bf16; an error when it was not built in or cannot run bf16 here), `sgemm`.
// oneDNN's own ONEDNN_MAX_CPU_ISA is honoured: what it allows decides "natively".
#pragma once
#include <string>

namespace pipetrain {

enum class Bf16Products { kSgemm, kOnednn };

// The policy table, pure: `policy` as PIPETRAIN_BF16_GEMM spells it ("" = auto), whether
// oneDNN is built in and can run bf16 here, and whether it does so natively. Fails (one
// line naming PIPETRAIN_BF16_GEMM) on an unknown policy or an `onednn` it cannot honour.
Bf16Products choose_bf16_products(const std::string& policy, bool onednn_usable, bool onednn_native);

// The path this process takes (decided once, on first use, from the environment).
Bf16Products bf16_products();

// Whether oneDNN is built in and runs bf16 matmuls on this CPU (natively or emulated),
// and whether natively.
bool onednn_bf16_usable();
bool onednn_bf16_native();

// For the header and --version: "oneDNN 2.6.3 (avx512_core_amx)", "sgemm on widened
// operands (no bf16 instructions)", "... (PIPETRAIN_BF16_GEMM)", "... (built without oneDNN)".
std::string bf16_products_summary();

// How many products oneDNN has run in this process (the tests check the path is taken).
long onednn_products_run();

// oneDNN's threads (its OpenMP runtime's), set with the BLAS's; a no-op without oneDNN.
void set_onednn_threads(int n);

}  // namespace pipetrain
