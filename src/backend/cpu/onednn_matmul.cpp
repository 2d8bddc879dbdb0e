#include "onednn_matmul.hpp"

#ifdef PIPETRAIN_HAVE_ONEDNN
#include "pipetrain/core/error.hpp"

namespace pipetrain::cpu {

std::optional<dnnl::matmul::primitive_desc> optimized_matmul(const dnnl::matmul::desc& desc,
                                                             const dnnl::primitive_attr& attr,
                                                             const dnnl::engine& engine, std::string_view what) {
  try {
    dnnl::matmul::primitive_desc pd(desc, attr, engine);
    if (std::string_view(pd.impl_info_str()).starts_with("ref")) return std::nullopt;
    return pd;
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_unimplemented) return std::nullopt;
    fail("oneDNN: cannot build {}: {}", what, e.what());
  }
}

}  // namespace pipetrain::cpu
#endif
