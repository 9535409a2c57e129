// Runs a libFuzzer target without libFuzzer: over the files given on the command line, then over
// random mutations of small valid safetensors files (seeded, seed printed). Used as a ctest.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  const char* env = std::getenv("NIBBLE_TEST_SEED");
  const uint64_t seed = env ? std::stoull(env) : std::chrono::steady_clock::now().time_since_epoch().count();
  std::printf("[seed] fuzz replay: NIBBLE_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
      R"("s":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[12,14]}})";
  std::vector<uint8_t> seed_file(8);
  for (int i = 0; i < 8; ++i) seed_file[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  seed_file.insert(seed_file.end(), header.begin(), header.end());
  seed_file.resize(seed_file.size() + 14, 0x3C);
  for (int trial = 0; trial < 200000; ++trial) {
    std::vector<uint8_t> bytes = seed_file;
    const int n_mutations = 1 + static_cast<int>(rng() % 6);
    for (int m = 0; m < n_mutations && !bytes.empty(); ++m) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 4) {
        case 0: bytes[at] = static_cast<uint8_t>(rng()); break;
        case 1: bytes.erase(bytes.begin() + static_cast<long>(at)); break;
        case 2: bytes.insert(bytes.begin() + static_cast<long>(at), "{}[]\",:0123456789"[rng() % 17]); break;
        default: bytes.resize(at); break;
      }
    }
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  std::printf("fuzz replay: 200000 mutated inputs, no crash\n");
  return 0;
}
