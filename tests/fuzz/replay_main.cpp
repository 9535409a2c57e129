// Runs a libFuzzer target without libFuzzer: over the seed files given on the command line, then
// over random mutations of them (seeded, seed printed). Used as a ctest for each fuzz target.
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
  // The seed files given on the command line run as they are, then mutated.
  std::vector<std::vector<uint8_t>> seeds;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(seeds.back().data(), seeds.back().size());
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "usage: %s SEED_FILE...\n", argv[0]);
    return 2;
  }
  const char* env = std::getenv("NIBBLE_TEST_SEED");
  const uint64_t seed = env ? std::stoull(env) : std::chrono::steady_clock::now().time_since_epoch().count();
  std::printf("[seed] fuzz replay: NIBBLE_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const int n_inputs = 20000;
  for (int trial = 0; trial < n_inputs; ++trial) {
    std::vector<uint8_t> bytes = seeds[rng() % seeds.size()];
    const int n_mutations = 1 + static_cast<int>(rng() % 6);
    for (int m = 0; m < n_mutations && !bytes.empty(); ++m) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 5) {
        case 0: bytes[at] = static_cast<uint8_t>(rng()); break;
        case 1: bytes.erase(bytes.begin() + static_cast<long>(at)); break;
        case 2: bytes.insert(bytes.begin() + static_cast<long>(at), "{}[]%#-\",:0123456789|("[rng() % 21]); break;
        case 3: {  // duplicate a slice: nests tags and brackets
          const size_t len = std::min<size_t>(1 + rng() % 64, bytes.size() - at);
          std::vector<uint8_t> slice(bytes.begin() + static_cast<long>(at), bytes.begin() + static_cast<long>(at + len));
          bytes.insert(bytes.begin() + static_cast<long>(rng() % bytes.size()), slice.begin(), slice.end());
          break;
        }
        default: bytes.resize(at); break;
      }
    }
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  std::printf("fuzz replay: %d mutated inputs, no crash\n", n_inputs);
  return 0;
}
