// The start-up check that a model's weights fit the GPUs given (engine/gpu_fit.h), on Qwen3-235B-A22B's
// published shapes (94 layers, hidden 4,096, 64 query and 4 KV heads, 128 experts of 1,536, top 8):
// ~134 GB of NVFP4 weights, more than an 80 GB card holds, which the error answers with the smallest
// --tensor-parallel-size whose share fits.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/gpu_fit.h"
#include "qwen3_moe_config.h"

using namespace nibble;
using json = nlohmann::json;

namespace {

io::ModelConfig qwen3_235b() {  // its published config.json's shapes
  return test::qwen3_moe_config({{"hidden_size", 4096},
                                 {"intermediate_size", 12288},
                                 {"num_hidden_layers", 94},
                                 {"num_attention_heads", 64},
                                 {"moe_intermediate_size", 1536},
                                 {"mlp_only_layers", nullptr}});
}

io::QuantConfig nvfp4() {  // nvidia/Qwen3-235B-A22B-NVFP4's exclusions
  io::QuantConfig q;
  q.nvfp4 = true;
  q.exclude_modules = {"lm_head", "model.layers.*.mlp.gate"};
  return q;
}

constexpr uint64_t H100 = 85'520'809'984;  // an H100 80GB HBM3's cudaMemGetInfo total

TEST(GpuFit, RanksShareTheWeightsAndTheBf16CopiesAreCounted) {
  const io::ModelConfig c = qwen3_235b();
  auto one = engine::rank_weight_bytes(c, nvfp4(), {1}, false), two = engine::rank_weight_bytes(c, nvfp4(), {2}, false);
  auto copies = engine::rank_weight_bytes(c, nvfp4(), {1}, true);
  ASSERT_TRUE(one.is_ok() && two.is_ok() && copies.is_ok());
  std::printf("Qwen3-235B-A22B: %.2f GB of weights; %.2f GB a rank at TP2; BF16 copies add %.2f GB\n", *one / 1e9,
              *two / 1e9, (*copies - *one) / 1e9);
  EXPECT_GT(*one, 125e9);
  EXPECT_LT(*one, 140e9);
  // Halved but for what every rank holds whole (norms, routers).
  EXPECT_GE(2 * *two, *one);
  EXPECT_LE(2 * *two, *one + *one / 100);
  // q/k/v and o of 94 layers in BF16: 94 · (4,096 · 9,216 + 8,192 · 4,096) · 2 bytes.
  EXPECT_EQ(*copies - *one, uint64_t(94) * (4096 * 9216 + 8192 * 4096) * 2);
}

TEST(GpuFit, TooLargeNamesTheParallelSizeThatFits) {
  const io::ModelConfig c = qwen3_235b();
  Status s = engine::check_weights_fit(c, nvfp4(), {1}, true, H100, 0.9, 8);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("at --tensor-parallel-size 1"), std::string::npos) << s.message();
  // TP2: ~67 GB of NVFP4 and ~6.7 GB of BF16 copies, past 0.9 · 85.5 − 3.2 GB.
  EXPECT_NE(s.message().find("--tensor-parallel-size 4 fits"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("this host has"), std::string::npos) << s.message();
  s = engine::check_weights_fit(c, nvfp4(), {2}, true, H100, 0.9, 2);
  ASSERT_FALSE(s.is_ok());
  std::printf("%s\n", s.message().c_str());
  EXPECT_NE(s.message().find("--tensor-parallel-size 4 fits (this host has 2 GPU(s))"), std::string::npos)
      << s.message();
  // Without the BF16 copies (--gemm-backend skinny) two ranks hold it.
  EXPECT_TRUE(engine::check_weights_fit(c, nvfp4(), {2}, false, H100, 0.9, 2).is_ok());
  EXPECT_TRUE(engine::check_weights_fit(c, nvfp4(), {4}, true, H100, 0.9, 4).is_ok());
  // Four ranks on one card (a test layout) share it.
  EXPECT_FALSE(engine::check_weights_fit(c, nvfp4(), {4}, true, H100, 0.9, 1, 4).is_ok());
}

TEST(GpuFit, ALayoutThatDoesNotSplitSaysWhy) {
  const Status s = engine::check_weights_fit(qwen3_235b(), nvfp4(), {3}, true, H100, 0.9, 8);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("does not split across 3 ranks"), std::string::npos) << s.message();
}

}  // namespace
