// The bytes a decode step reads (io::bytes_per_decode_step), the floor `nibble bench latency` puts
// beside its decode rows, on Qwen3-30B-A3B's shapes: one token is bytes_per_decoded_token, every
// layer's experts count by the chance a batch picks them (1 − (1 − k/E)^B), the rest once.
#include <gtest/gtest.h>

#include <cmath>

#include "io/weight_plan.h"
#include "qwen3_moe_config.h"

using namespace nibble::io;

namespace {

QuantConfig nvfp4() {
  QuantConfig q;
  q.nvfp4 = true;
  q.exclude_modules = {"lm_head", "model.layers.*.mlp.gate"};
  return q;
}

}  // namespace

TEST(DecodeBytes, BatchesReadEachExpertByTheChanceItIsPicked) {
  const ModelConfig c = nibble::test::qwen3_moe_config({{"num_hidden_layers", 48}, {"mlp_only_layers", nullptr}});
  const std::vector<ModuleSpec> modules = plan_modules(c, nvfp4());
  double experts = 0, embedding_row = 0, rest = 0;
  for (const ModuleSpec& m : modules) {
    if (m.expert >= 0)
      experts += double(m.nbytes());
    else if (m.kind == ModuleKind::EMBEDDING)
      embedding_row = double(m.nbytes()) / double(m.shape[0]);
    else
      rest += double(m.nbytes());
  }
  EXPECT_EQ(bytes_per_decode_step(c, modules, 1), bytes_per_decoded_token(c, modules));
  // One token: 8 of 128 experts a layer (~1.0 GB), the attention, routers and the BF16 lm_head.
  const double one = double(bytes_per_decoded_token(c, modules));
  EXPECT_NEAR(one, rest + embedding_row + experts * 8 / 128, 1.0);
  EXPECT_GT(one / 1e9, 2.0);
  EXPECT_LT(one / 1e9, 2.4);
  for (int64_t B : {2, 8, 64, 256}) {
    const double touched = 1.0 - std::pow(1.0 - 8.0 / 128.0, double(B));
    EXPECT_NEAR(double(bytes_per_decode_step(c, modules, B)), rest + B * embedding_row + experts * touched, 1.0) << B;
  }
  // 64 sequences touch ~126 of 128 experts a layer (docs/perf.md "Floors"); the bytes only grow with B.
  EXPECT_NEAR(1.0 - std::pow(1.0 - 8.0 / 128.0, 64.0), 126.0 / 128.0, 0.01);
  EXPECT_LT(bytes_per_decode_step(c, modules, 64), bytes_per_decode_step(c, modules, 65));
  EXPECT_LT(double(bytes_per_decode_step(c, modules, 1024)), rest + 1024 * embedding_row + experts + 1.0);
}
