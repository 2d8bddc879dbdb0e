// oneDNN's matmul where it is worth calling: the CPU backend's products through oneDNN
// (bf16 operands, gemm_bf16_onednn.cpp; weights kept packed, dense_packed.cpp) each fall
// back to a BLAS path, which is faster than oneDNN's reference implementation.
#pragma once
#ifdef PIPETRAIN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include <optional>
#include <string_view>

namespace pipetrain::cpu {

// The primitive descriptor of `desc` under `attr` on `engine` when oneDNN has an optimized
// implementation for it; none where it has only its reference one or none at all (the
// caller's BLAS path runs the product: complete, not a gap). Any other failure is an
// error naming `what`.
std::optional<dnnl::matmul::primitive_desc> optimized_matmul(const dnnl::matmul::desc& desc,
                                                             const dnnl::primitive_attr& attr,
                                                             const dnnl::engine& engine, std::string_view what);

}  // namespace pipetrain::cpu
#endif
