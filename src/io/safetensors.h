// safetensors reading (mmap, one file or a sharded folder with model.safetensors.index.json) and
// writing (sharded, with index). Format: huggingface/safetensors README — 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then data.
// Every malformed input is an error naming the file and what is wrong; nothing here aborts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace nibble::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  uint64_t data_begin = 0;  // byte offset of the tensor's data from the start of the file
  uint64_t nbytes = 0;

  int64_t numel() const;
};

// A parsed header. Tensors are sorted by name.
struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

// Parses and validates the header of a whole file held in `file` (header length in range, JSON
// object, known dtypes, non-negative shapes, offsets inside the data, no overlap, byte size equal
// to shape × dtype size). `file_name` only labels errors.
Result<SafetensorsHeader> parse_safetensors(std::span<const uint8_t> file, std::string_view file_name);

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const TensorInfo* find(std::string_view name) const;
  std::span<const uint8_t> data(const TensorInfo& tensor) const;
  uint64_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  SafetensorsHeader header_;
};

// A checkpoint's tensors: a single .safetensors file, or a folder with model.safetensors (or
// model.safetensors.index.json and its shards). Names are unique across shards.
class SafetensorsReader {
 public:
  static Result<SafetensorsReader> open(const std::string& path);

  struct Entry {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  const Entry* find(std::string_view name) const;
  std::span<const uint8_t> data(const Entry& entry) const { return entry.file->data(*entry.info); }
  const std::map<std::string, Entry, std::less<>>& tensors() const { return tensors_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  uint64_t total_file_bytes() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> tensors_;
};

// A tensor to be written: its bytes are filled by the caller after the files are laid out.
struct TensorSpec {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

// Lays out tensors into shards of at most max_shard_bytes (a larger tensor gets a shard of its
// own) and creates the files; write() then stores each tensor's bytes (pwrite, so several threads
// may write different tensors at once without contending on page faults of a shared mapping).
// finish() syncs, closes and writes model.safetensors.index.json (a single shard is named
// model.safetensors and needs no index).
class ShardedWriter {
 public:
  static Result<std::unique_ptr<ShardedWriter>> create(const std::string& dir, std::vector<TensorSpec> tensors,
                                                       uint64_t max_shard_bytes,
                                                       std::map<std::string, std::string> metadata);
  ~ShardedWriter();
  ShardedWriter(const ShardedWriter&) = delete;
  ShardedWriter& operator=(const ShardedWriter&) = delete;

  // Stores all bytes of one tensor; `bytes` must have exactly the tensor's size.
  Status write(std::string_view name, std::span<const uint8_t> bytes);
  Status finish();
  const std::vector<std::string>& shard_files() const { return shard_names_; }

 private:
  ShardedWriter() = default;
  struct Shard {
    std::string path;
    int fd = -1;
  };
  std::string dir_;
  std::vector<Shard> shards_;
  std::vector<std::string> shard_names_;
  std::map<std::string, std::pair<size_t, TensorInfo>, std::less<>> placement_;  // name → shard, info
};

}  // namespace nibble::io
