// The tensor / expert parallel partition (io/partition.h) of Qwen3-30B-A3B's and ERNIE-4.5's shapes:
// the ranks' slices tile every split tensor exactly once, NVFP4 weights and block scales move together,
// KV heads replicate past their count, experts deal out whole, and shapes that do not split are
// errors naming each dimension.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "io/partition.h"
#include "qwen3_moe_config.h"

using namespace nibble::io;
using json = nlohmann::json;

namespace {

ModelConfig config(const json& changes = json::object()) { return nibble::test::qwen3_moe_config(changes); }

QuantConfig nvfp4() {
  QuantConfig q;
  q.nvfp4 = true;
  q.exclude_modules = {"lm_head", "model.layers.*.mlp.gate"};
  return q;
}

std::vector<RankPlan> plans(const ModelConfig& c, int64_t n, bool ep = false) {
  std::vector<RankPlan> out;
  for (int64_t r = 0; r < n; ++r) {
    auto p = partition(c, nvfp4(), {n, r, ep});
    EXPECT_TRUE(p.is_ok()) << p.status().message();
    out.push_back(*p);
  }
  return out;
}

// Every stored tensor: the ranks that hold it whole, and the ranges the others hold along one dim.
struct Coverage {
  int64_t whole = 0;
  std::map<int64_t, int64_t> ranges;  // begin -> end
  int dim = -1;
  std::vector<int64_t> shape;
};

std::map<std::string, Coverage> coverage(const std::vector<RankPlan>& ranks) {
  std::map<std::string, Coverage> out;
  for (const RankPlan& p : ranks)
    for (const TensorSlice& s : p.slices) {
      Coverage& c = out[s.tensor.name];
      c.shape = s.tensor.shape;
      if (s.dim < 0) {
        ++c.whole;
      } else {
        c.dim = s.dim;
        c.ranges[s.begin] = s.end;
      }
    }
  return out;
}

TEST(Partition, TensorParallelSlicesTileEveryTensorOnce) {
  const ModelConfig c = config();
  const int64_t n = 2;
  const auto ranks = plans(c, n);
  const auto cover = coverage(ranks);
  ASSERT_FALSE(cover.empty());
  for (const auto& [name, cv] : cover) {
    SCOPED_TRACE(name);
    if (cv.dim < 0) {
      EXPECT_EQ(cv.whole, n);  // replicated: every rank loads it all
      continue;
    }
    // Split: the ranges tile [0, shape[dim]) in order, one a rank.
    EXPECT_EQ(cv.ranges.size(), size_t(n));
    int64_t at = 0;
    for (const auto& [b, e] : cv.ranges) {
      EXPECT_EQ(b, at);
      at = e;
    }
    EXPECT_EQ(at, cv.shape[size_t(cv.dim)]);
  }
  // The splits Megatron's layout asks for.
  auto split_of = [&](const std::string& module) {
    for (const RankModule& m : ranks[1].modules)
      if (m.module.name == module) return std::make_tuple(m.split, m.begin, m.end);
    return std::make_tuple(Split::ABSENT, int64_t{-1}, int64_t{-1});
  };
  EXPECT_EQ(split_of("model.layers.0.self_attn.q_proj"), std::make_tuple(Split::ROWS, int64_t{2048}, int64_t{4096}));
  EXPECT_EQ(split_of("model.layers.0.self_attn.k_proj"), std::make_tuple(Split::ROWS, int64_t{256}, int64_t{512}));
  EXPECT_EQ(split_of("model.layers.0.self_attn.o_proj"), std::make_tuple(Split::COLUMNS, int64_t{2048}, int64_t{4096}));
  EXPECT_EQ(split_of("model.layers.0.mlp.experts.5.up_proj"), std::make_tuple(Split::ROWS, int64_t{384}, int64_t{768}));
  EXPECT_EQ(split_of("model.layers.0.mlp.experts.5.down_proj"),
            std::make_tuple(Split::COLUMNS, int64_t{384}, int64_t{768}));
  EXPECT_EQ(split_of("model.layers.1.mlp.down_proj"), std::make_tuple(Split::COLUMNS, int64_t{3072}, int64_t{6144}));
  EXPECT_EQ(std::get<0>(split_of("model.layers.0.mlp.gate")), Split::WHOLE);
  EXPECT_EQ(std::get<0>(split_of("model.layers.0.self_attn.q_norm")), Split::WHOLE);
  EXPECT_EQ(split_of("lm_head"), std::make_tuple(Split::ROWS, int64_t{75968}, int64_t{151936}));
  // An NVFP4 row-parallel weight: the same values in bytes (two a byte) and in block scales (16 a block).
  std::map<std::string, TensorSlice> by_name;
  for (const TensorSlice& s : ranks[1].slices) by_name[s.tensor.name] = s;
  const TensorSlice& w = by_name.at("model.layers.0.mlp.experts.5.down_proj.weight");
  const TensorSlice& ws = by_name.at("model.layers.0.mlp.experts.5.down_proj.weight_scale");
  EXPECT_EQ(w.dim, 1);
  EXPECT_EQ(std::make_pair(w.begin * 2, w.end * 2), std::make_pair(int64_t{384}, int64_t{768}));
  EXPECT_EQ(std::make_pair(ws.begin * 16, ws.end * 16), std::make_pair(int64_t{384}, int64_t{768}));
  EXPECT_EQ(by_name.at("model.layers.0.mlp.experts.5.down_proj.weight_scale_2").dim, -1);  // a scalar
  // Bytes: the split tensors once over all ranks, the replicated ones on each.
  uint64_t full = 0, split = 0;
  for (const ModuleSpec& m : plan_modules(c, nvfp4())) full += m.nbytes();
  for (const RankPlan& p : ranks)
    for (const RankModule& m : p.modules) split += m.module.nbytes();
  EXPECT_GT(split, full);
  EXPECT_LT(double(split), 1.01 * double(full));  // only norms, the router and scalars repeat
}

TEST(Partition, KvHeadsReplicatePastTheirCount) {
  const auto ranks = plans(config(), 8);  // 4 KV heads over 8 ranks: two ranks a head
  for (int64_t r = 0; r < 8; ++r)
    for (const RankModule& m : ranks[size_t(r)].modules)
      if (m.module.name == "model.layers.0.self_attn.v_proj") {
        EXPECT_EQ(m.begin, (r / 2) * 128) << r;
        EXPECT_EQ(m.end, (r / 2 + 1) * 128) << r;
      }
}

TEST(Partition, ExpertParallelDealsExpertsOutWhole) {
  const auto ranks = plans(config(), 4, /*ep=*/true);
  for (int64_t r = 0; r < 4; ++r) {
    int64_t experts = 0;
    for (const RankModule& m : ranks[size_t(r)].modules) {
      if (m.module.expert < 0) continue;
      EXPECT_EQ(m.split, Split::WHOLE);
      EXPECT_EQ(m.module.expert / 32, r) << m.module.name;
      experts += m.module.role == ModuleRole::EXPERT_UP;
    }
    EXPECT_EQ(experts, 32);  // one layer of MoE: 128 / 4
    for (const RankModule& m : ranks[size_t(r)].modules)
      if (m.module.name == "model.layers.0.self_attn.q_proj") EXPECT_EQ(m.split, Split::ROWS);  // attention: TP
  }
}

TEST(Partition, ShapesThatDoNotSplitAreErrorsNamingEachDimension) {
  auto error = [](const ModelConfig& c, int64_t n, bool ep = false) {
    return partition(c, nvfp4(), {n, 0, ep}).status().message();
  };
  const std::string three = error(config(), 3);
  EXPECT_NE(three.find("does not split over 3 GPUs"), std::string::npos) << three;
  EXPECT_NE(three.find("num_attention_heads 32 does not split across 3 ranks"), std::string::npos) << three;
  EXPECT_NE(three.find("num_key_value_heads 4 neither splits nor replicates"), std::string::npos) << three;
  EXPECT_NE(three.find("vocab_size 151936 does not split"), std::string::npos) << three;
  EXPECT_EQ(three.find("moe_intermediate_size"), std::string::npos) << three;  // 768 / 3 = 256: whole blocks
  // 768 / 32 = 24 values: not whole NVFP4 blocks.
  const std::string blocks = error(config({{"num_attention_heads", 64}}), 32);
  EXPECT_NE(blocks.find("moe_intermediate_size 768 does not split into multiples of 16"), std::string::npos) << blocks;
  EXPECT_NE(error(config(), 3, true).find("num_experts 128 do not deal out evenly"), std::string::npos);
  EXPECT_NE(partition(config(), nvfp4(), {2, 2, false}).status().message().find("not a rank"), std::string::npos);
  EXPECT_TRUE(partition(config(), nvfp4(), {1, 0, false}).is_ok());
}

TEST(Partition, ErnieSharedExpertsAndItsDenseFirstLayer) {
  const ModelConfig c = config({{"architectures", {"Ernie4_5_MoeForCausalLM"}},
                                {"vocab_size", 103424},
                                {"hidden_size", 2560},
                                {"intermediate_size", 12288},
                                {"num_attention_heads", 20},
                                {"num_key_value_heads", 4},
                                {"moe_num_experts", 64},
                                {"moe_k", 6},
                                {"moe_intermediate_size", 1536},
                                {"moe_num_shared_experts", 2},
                                {"moe_layer_start_index", 1},
                                {"rope_theta", 500000}});
  const auto cover = coverage(plans(c, 4));
  bool shared = false;
  for (const auto& [name, cv] : cover) {
    if (name.find("shared_experts.down_proj.weight") == std::string::npos || name.find("scale") != std::string::npos)
      continue;
    shared = true;
    EXPECT_EQ(cv.dim, 1) << name;  // row-parallel: its input (2 · 1536 / 4 values a rank) split
    EXPECT_EQ(cv.ranges.size(), 4u) << name;
  }
  EXPECT_TRUE(shared);
  EXPECT_NE(partition(c, nvfp4(), {3, 0, false}).status().message().find("num_attention_heads 20"), std::string::npos);
}

}  // namespace
