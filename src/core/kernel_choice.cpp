// Names of the kernel choices (kernel_choice.h), as the command-line flags spell them.
#include "core/kernel_choice.h"

namespace nibble {
namespace {

constexpr DenseKernel DENSE[] = {DenseKernel::AUTO,         DenseKernel::GEMV,  DenseKernel::SKINNY,
                                 DenseKernel::SKINNY_SPLIT, DenseKernel::WGMMA, DenseKernel::CUBLAS};
constexpr MoeKernel MOE[] = {MoeKernel::AUTO, MoeKernel::GROUPED_MMA, MoeKernel::SKINNY, MoeKernel::WGMMA,
                             MoeKernel::CUBLAS};

template <class Kernel, size_t N>
std::optional<Kernel> parse(const Kernel (&all)[N], std::string_view name) {
  for (Kernel k : all)
    if (name == kernel_name(k)) return k;
  return std::nullopt;
}

template <class Kernel, size_t N>
std::vector<std::string> names(const Kernel (&all)[N]) {
  std::vector<std::string> v;
  for (Kernel k : all) v.emplace_back(kernel_name(k));
  return v;
}

}  // namespace

const char* kernel_name(DenseKernel kernel) {
  switch (kernel) {
    case DenseKernel::AUTO:
      return "auto";
    case DenseKernel::GEMV:
      return "gemv";
    case DenseKernel::SKINNY:
      return "skinny";
    case DenseKernel::SKINNY_SPLIT:
      return "skinny-split";
    case DenseKernel::WGMMA:
      return "wgmma";
    case DenseKernel::CUBLAS:
      return "cublas";
  }
  return "?";
}

const char* kernel_name(MoeKernel kernel) {
  switch (kernel) {
    case MoeKernel::AUTO:
      return "auto";
    case MoeKernel::GROUPED_MMA:
      return "grouped-mma";
    case MoeKernel::SKINNY:
      return "skinny";
    case MoeKernel::WGMMA:
      return "wgmma";
    case MoeKernel::CUBLAS:
      return "cublas";
  }
  return "?";
}

std::optional<DenseKernel> parse_dense_kernel(std::string_view name) { return parse(DENSE, name); }
std::optional<MoeKernel> parse_moe_kernel(std::string_view name) { return parse(MOE, name); }

const std::vector<std::string>& dense_kernel_names() {
  static const std::vector<std::string> v = names(DENSE);
  return v;
}

const std::vector<std::string>& moe_kernel_names() {
  static const std::vector<std::string> v = names(MOE);
  return v;
}

std::string choices_help(const std::vector<std::string>& names) {
  std::string help;
  for (const std::string& name : names) help += (help.empty() ? "" : " | ") + name;
  return help;
}

}  // namespace nibble
