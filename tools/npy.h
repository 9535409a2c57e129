// Writes a 2-D float32 array as a NumPy .npy file (format v1.0: numpy.lib.format docs).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "core/status.h"

namespace nibble::tools {

inline Status write_npy_f32(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  // Magic (6) + version (2) + header length (2) + header + '\n', padded to a multiple of 64.
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.put(static_cast<char>(len & 0xFF)).put(static_cast<char>(len >> 8));
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
  return out ? Status::ok() : Status::error(path + ": cannot write");
}

}  // namespace nibble::tools
