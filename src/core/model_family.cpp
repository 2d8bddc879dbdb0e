#include "pipetrain/core/model_family.hpp"

#include <fmt/format.h>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {
constexpr ModelFamily kFamilies[] = {
    {.arch = "gpt2",
     .name = "GPT-2",
     .blocks = BlockKind::Gpt2,
     .learned_positions = true,
     .rms_norm = false,
     .grouped_kv = false,
     .gated_mlp = false,
     .always_tied = true,
     .experts = false,
     .hf_format = false},
    {.arch = "llama",
     .name = "Llama",
     .blocks = BlockKind::Llama,
     .learned_positions = false,
     .rms_norm = true,
     .grouped_kv = true,
     .gated_mlp = true,
     .always_tied = false,
     .experts = true,
     .hf_format = true},
};
}  // namespace

const ModelFamily* find_model_family(std::string_view arch) {
  for (const ModelFamily& f : kFamilies)
    if (f.arch == arch) return &f;
  return nullptr;
}

const ModelFamily& model_family(std::string_view arch) {
  if (const ModelFamily* f = find_model_family(arch)) return *f;
  fail("model.arch: unsupported architecture \"{}\" (expected {})", arch, model_family_names());
}

std::string model_family_names() {
  std::string out;
  for (size_t i = 0; i < std::size(kFamilies); ++i)
    out += fmt::format("{}\"{}\"", i == 0 ? "" : i + 1 == std::size(kFamilies) ? " or " : ", ", kFamilies[i].arch);
  return out;
}

}  // namespace pipetrain
