// Test helper for the pytest differential tests: runs one host NVFP4 quantizer on a raw float32 file.
// Usage: nvfp4_tool weight|static|per-token IN.f32 ROWS COLS SCALE OUT_DIR
//   SCALE: weight → shared weight_scale_2 (0 = compute it); static → input_scale; per-token → ignored.
// Writes OUT_DIR/{packed.u8, block_scales.u8, scale.f32, row_scales.f32, dequant.f32}.
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "formats/nvfp4.h"

using namespace nibble::formats;

namespace {

template <class T>
void write_file(const std::string& path, const std::vector<T>& data) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * sizeof(T)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s weight|static|per-token IN.f32 ROWS COLS SCALE OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const int64_t rows = std::stoll(argv[3]), cols = std::stoll(argv[4]);
  const float scale = std::stof(argv[5]);
  const std::string out_dir = argv[6];
  std::ifstream in(argv[2], std::ios::binary);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  in.read(reinterpret_cast<char*>(x.data()), static_cast<std::streamsize>(x.size() * sizeof(float)));
  if (!in) {
    std::fprintf(stderr, "cannot read %zu floats from %s\n", x.size(), argv[2]);
    return 1;
  }
  nibble::Result<Nvfp4Matrix> q =
      mode == "weight"   ? quantize_weight(x, rows, cols, "input",
                                           scale > 0 ? std::optional<float>(scale) : std::nullopt)
      : mode == "static" ? quantize_activation_static(x, rows, cols, scale, "input")
                         : quantize_activation_per_token(x, rows, cols, "input");
  if (!q) {
    std::fprintf(stderr, "%s\n", q.status().message().c_str());
    return 1;
  }
  write_file(out_dir + "/packed.u8", q->packed);
  write_file(out_dir + "/block_scales.u8", q->block_scales);
  write_file(out_dir + "/scale.f32", std::vector<float>{q->scale});
  write_file(out_dir + "/row_scales.f32", q->row_scales);
  write_file(out_dir + "/dequant.f32", dequantize(*q));
  return 0;
}
