// safetensors: writer → reader round trips (single and sharded), exact error messages for the
// classic corruptions, and a randomized corruption sweep that must never crash or mis-validate.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "io/safetensors.h"
#include "test_seed.h"

using namespace nibble;
using namespace nibble::io;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("nibble_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Writes one tensor of every dtype, filled with a byte pattern derived from the name.
std::vector<TensorSpec> all_dtype_specs() {
  std::vector<TensorSpec> specs;
  const DType dtypes[] = {DType::BF16, DType::F16, DType::F32, DType::F64,  DType::U8,      DType::I8,
                          DType::I16,  DType::I32, DType::I64, DType::BOOL, DType::F8_E4M3, DType::F8_E5M2};
  int i = 0;
  for (DType d : dtypes) specs.push_back({"t." + std::string(dtype_name(d)), d, {3, 2 + i++}});
  specs.push_back({"scalar", DType::F32, {}});
  specs.push_back({"empty", DType::F32, {0, 4}});
  return specs;
}

uint8_t pattern(const std::string& name, size_t i) {
  return static_cast<uint8_t>(std::hash<std::string>{}(name) + i * 31);
}

void write_checkpoint(const fs::path& dir, uint64_t shard_bytes) {
  auto writer = ShardedWriter::create(dir.string(), all_dtype_specs(), shard_bytes, {{"format", "pt"}});
  ASSERT_TRUE(writer.is_ok()) << writer.status().message();
  for (const TensorSpec& t : all_dtype_specs()) {
    std::vector<uint8_t> bytes(t.nbytes());
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern(t.name, i);
    ASSERT_TRUE((*writer)->write(t.name, bytes).is_ok());
  }
  ASSERT_TRUE((*writer)->finish().is_ok());
}

void expect_checkpoint(const std::string& path) {
  auto reader = SafetensorsReader::open(path);
  ASSERT_TRUE(reader.is_ok()) << reader.status().message();
  ASSERT_EQ(reader->tensors().size(), all_dtype_specs().size());
  for (const TensorSpec& t : all_dtype_specs()) {
    const auto* e = reader->find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->info->dtype, t.dtype);
    EXPECT_EQ(e->info->shape, t.shape);
    auto data = reader->data(*e);
    ASSERT_EQ(data.size(), t.nbytes());
    for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], pattern(t.name, i)) << t.name;
  }
}

}  // namespace

TEST(Safetensors, RoundTripSingleFile) {
  const fs::path dir = temp_dir("single");
  write_checkpoint(dir, 1ull << 40);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  expect_checkpoint(dir.string());
  expect_checkpoint((dir / "model.safetensors").string());
  auto file = SafetensorsFile::open((dir / "model.safetensors").string());
  ASSERT_TRUE(file.is_ok());
  EXPECT_EQ((*file)->header().metadata.at("format"), "pt");
  fs::remove_all(dir);
}

TEST(Safetensors, RoundTripSharded) {
  const fs::path dir = temp_dir("sharded");
  write_checkpoint(dir, 40);  // tiny shards: several files and an index
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  auto reader = SafetensorsReader::open(dir.string());
  ASSERT_TRUE(reader.is_ok()) << reader.status().message();
  EXPECT_GT(reader->files().size(), 3u);
  expect_checkpoint(dir.string());
  fs::remove_all(dir);
}

TEST(Safetensors, WriterRejectsWrongSizesAndNames) {
  const fs::path dir = temp_dir("writer");
  auto writer = ShardedWriter::create(dir.string(), {{"a", DType::F32, {2}}}, 1 << 20, {});
  ASSERT_TRUE(writer.is_ok());
  const std::vector<uint8_t> three(3);
  EXPECT_NE((*writer)->write("a", three).message().find("has 8 bytes, got 3"), std::string::npos);
  EXPECT_NE((*writer)->write("b", three).message().find("no tensor 'b'"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Safetensors, ShardedIndexProblemsAreErrors) {
  const fs::path dir = temp_dir("badindex");
  write_checkpoint(dir, 40);
  fs::path shard;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind("model-00002-of-", 0) == 0) shard = entry.path();
  ASSERT_FALSE(shard.empty()) << "expected several shards";
  fs::remove(shard);
  auto reader = SafetensorsReader::open(dir.string());
  ASSERT_FALSE(reader.is_ok());
  EXPECT_NE(reader.status().message().find(shard.filename().string() + ": cannot open"), std::string::npos)
      << reader.status().message();
  fs::remove_all(dir);
}

TEST(Safetensors, ClassicCorruptionsNameFileAndProblem) {
  const fs::path dir = temp_dir("corrupt");
  write_checkpoint(dir, 1ull << 40);
  const fs::path path = dir / "model.safetensors";
  const auto good = read_bytes(path);
  struct Case {
    std::string what;
    std::vector<uint8_t> bytes;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"empty", {}, "shorter than the 8-byte header length"});
  cases.push_back({"truncated data", {good.begin(), good.end() - 5}, "(truncated?)"});
  auto long_header = good;
  long_header[0] = 0xFF, long_header[1] = 0xFF, long_header[2] = 0xFF;
  cases.push_back({"header length past end", long_header, "runs past the end"});
  auto not_json = good;
  not_json[8] = '[';
  cases.push_back({"not json", not_json, "not valid JSON"});
  auto trailing = good;
  trailing.push_back(0);
  cases.push_back({"trailing bytes", trailing, "(trailing bytes)"});
  for (const Case& c : cases) {
    auto parsed = parse_safetensors(c.bytes, "model.safetensors");
    ASSERT_FALSE(parsed.is_ok()) << c.what;
    EXPECT_NE(parsed.status().message().find("model.safetensors: "), std::string::npos) << c.what;
    EXPECT_NE(parsed.status().message().find(c.message), std::string::npos)
        << c.what << ": " << parsed.status().message();
  }
  fs::remove_all(dir);
}

TEST(Safetensors, HeaderFieldErrors) {
  auto file_with_header = [](const std::string& header, size_t data_bytes) {
    std::vector<uint8_t> bytes(8);
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(header.size() >> (8 * i));
    bytes.insert(bytes.end(), header.begin(), header.end());
    bytes.resize(bytes.size() + data_bytes, 0);
    return bytes;
  };
  const struct {
    std::string header;
    size_t data;
    std::string message;
  } cases[] = {
      {R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8, "unknown dtype 'F33'"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "negative dimension"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "shape × dtype size is 12"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "end before they begin"},
      {R"({"a":{"dtype":"F32","shape":[2]}})", 8, "'data_offsets' must be"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "overlapping"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "leaving a gap"},
      {R"({"__metadata__":{"k":1}})", 0, "is not a string"},
      {R"([1,2])", 0, "not a JSON object"},
      {R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8, "overflows"},
  };
  for (const auto& c : cases) {
    auto parsed = parse_safetensors(file_with_header(c.header, c.data), "x.safetensors");
    ASSERT_FALSE(parsed.is_ok()) << c.header;
    EXPECT_NE(parsed.status().message().find(c.message), std::string::npos)
        << c.header << " → " << parsed.status().message();
  }
}

TEST(Safetensors, RandomCorruptionNeverCrashesOrMisvalidates) {
  const fs::path dir = temp_dir("random");
  write_checkpoint(dir, 1ull << 40);
  const auto good = read_bytes(dir / "model.safetensors");
  std::mt19937_64 rng(test::test_seed("RandomCorruption"));
  size_t rejected = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    auto bytes = good;
    switch (rng() % 4) {
      case 0:
        bytes.resize(rng() % bytes.size());
        break;  // truncate
      case 1:
        for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k)  // flip header bytes
          bytes[rng() % std::min<size_t>(bytes.size(), 400)] ^= static_cast<uint8_t>(1 + rng() % 255);
        break;
      case 2:
        bytes[rng() % 8] = static_cast<uint8_t>(rng());
        break;  // header length
      default:
        bytes.insert(bytes.begin() + static_cast<long>(rng() % bytes.size()),
                     static_cast<uint8_t>(rng()));  // insert a byte
    }
    auto parsed = parse_safetensors(bytes, "model.safetensors");
    if (!parsed.is_ok()) {
      ++rejected;
      EXPECT_FALSE(parsed.status().message().empty());
      continue;
    }
    // Accepted (a change that kept the file valid, e.g. a flipped data byte or a changed name):
    // then every tensor must lie inside the file with the right size.
    for (const TensorInfo& t : parsed->tensors) {
      ASSERT_LE(t.data_begin + t.nbytes, bytes.size()) << t.name;
    }
  }
  std::printf("rejected %zu of 20000 corrupted files\n", rejected);
  EXPECT_GT(rejected, 15000u);
  fs::remove_all(dir);
}
