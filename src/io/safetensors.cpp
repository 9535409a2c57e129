// safetensors reader and writer. Validation follows the reference implementation's rules
// (huggingface/safetensors `validate`): data offsets sorted, contiguous from 0 to the end of the
// file, and each tensor's byte size equal to its shape times its dtype size.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace nibble::io {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t MAX_HEADER_BYTES = 100'000'000;  // the reference implementation's limit
constexpr const char* INDEX_FILE = "model.safetensors.index.json";

Status file_error(std::string_view file, const std::string& what) {
  return Status::error(std::string(file) + ": " + what);
}

// Product of dims times the element size, or nullopt on overflow past 2^62.
std::optional<uint64_t> checked_nbytes(const std::vector<int64_t>& shape, DType dtype) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) || n > (1ull << 62)) return std::nullopt;
  }
  return n;
}

Result<TensorInfo> parse_tensor_entry(const std::string& name, const json& entry, std::string_view file) {
  const std::string where = "tensor '" + name + "': ";
  if (!entry.is_object()) return file_error(file, where + "header entry is not an object");
  TensorInfo info;
  info.name = name;
  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string())
    return file_error(file, where + "missing string field 'dtype'");
  const auto dtype = dtype_from_name(dtype_it->get<std::string>());
  if (!dtype) return file_error(file, where + "unknown dtype '" + dtype_it->get<std::string>() + "'");
  info.dtype = *dtype;
  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) return file_error(file, where + "missing array field 'shape'");
  for (const json& d : *shape_it) {
    if (!d.is_number_unsigned()) return file_error(file, where + "shape has a non-integer or negative dimension");
    if (d.get<uint64_t>() > (1ull << 62)) return file_error(file, where + "shape dimension too large");
    info.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned())
    return file_error(file, where + "'data_offsets' must be two non-negative integers");
  const uint64_t begin = (*offsets_it)[0].get<uint64_t>(), end = (*offsets_it)[1].get<uint64_t>();
  if (end < begin) return file_error(file, where + "data_offsets end before they begin");
  const auto nbytes = checked_nbytes(info.shape, info.dtype);
  if (!nbytes) return file_error(file, where + "shape × dtype size overflows");
  if (end - begin != *nbytes) {
    return file_error(file, where + "data_offsets span " + std::to_string(end - begin) +
                                " bytes but shape × dtype size is " + std::to_string(*nbytes));
  }
  info.data_begin = begin;  // relative to the data section until the caller rebases it
  info.nbytes = *nbytes;
  return info;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t TensorSpec::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Result<SafetensorsHeader> parse_safetensors(std::span<const uint8_t> file, std::string_view name) {
  if (file.size() < 8) {
    return file_error(
        name, "file is " + std::to_string(file.size()) + " bytes, shorter than the 8-byte header length (truncated?)");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | file[i];
  if (header_len > MAX_HEADER_BYTES) {
    return file_error(name, "header length " + std::to_string(header_len) + " exceeds the 100 MB limit (corrupt?)");
  }
  if (header_len > file.size() - 8) {
    return file_error(name, "header length " + std::to_string(header_len) + " runs past the end of the " +
                                std::to_string(file.size()) + "-byte file (truncated?)");
  }
  const json header = json::parse(file.begin() + 8, file.begin() + 8 + static_cast<ptrdiff_t>(header_len), nullptr,
                                  /*allow_exceptions=*/false);
  if (header.is_discarded()) return file_error(name, "header is not valid JSON");
  if (!header.is_object()) return file_error(name, "header is not a JSON object");

  SafetensorsHeader result;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return file_error(name, "__metadata__ is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) return file_error(name, "__metadata__['" + mk + "'] is not a string");
        result.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    Result<TensorInfo> info = parse_tensor_entry(key, value, name);
    if (!info) return info.status();
    result.tensors.push_back(std::move(info.value()));
  }

  // Data must be laid out contiguously from 0 to the end of the file, in offset order.
  const uint64_t data_size = file.size() - 8 - header_len;
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : result.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->data_begin != b->data_begin ? a->data_begin < b->data_begin : a->nbytes < b->nbytes;
  });
  uint64_t expected = 0;
  for (const TensorInfo* t : by_offset) {
    if (t->data_begin != expected) {
      return file_error(name, "tensor '" + t->name + "' data starts at " + std::to_string(t->data_begin) +
                                  (t->data_begin < expected ? ", overlapping the previous tensor"
                                                            : ", leaving a gap after the previous tensor") +
                                  " (expected " + std::to_string(expected) + ")");
    }
    expected += t->nbytes;
  }
  if (expected != data_size) {
    return file_error(name, "tensors cover " + std::to_string(expected) + " data bytes but the file holds " +
                                std::to_string(data_size) +
                                (expected > data_size ? " (truncated?)" : " (trailing bytes)"));
  }
  for (TensorInfo& t : result.tensors) t.data_begin += 8 + header_len;
  std::sort(result.tensors.begin(), result.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return result;
}

// ---- SafetensorsFile ---------------------------------------------------------------------------

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return file_error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return file_error(path, "not a regular file");
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ > 0) {
    void* map = mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      ::close(fd);
      return file_error(path, std::string("cannot mmap: ") + std::strerror(errno));
    }
    file->map_ = static_cast<const uint8_t*>(map);
  }
  ::close(fd);
  Result<SafetensorsHeader> header = parse_safetensors({file->map_, file->size_}, path);
  if (!header) return header.status();
  file->header_ = std::move(header.value());
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(const_cast<uint8_t*>(map_), size_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(header_.tensors.begin(), header_.tensors.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != header_.tensors.end() && it->name == name ? &*it : nullptr;
}

std::span<const uint8_t> SafetensorsFile::data(const TensorInfo& tensor) const {
  return {map_ + tensor.data_begin, tensor.nbytes};
}

// ---- SafetensorsReader -------------------------------------------------------------------------

Result<SafetensorsReader> SafetensorsReader::open(const std::string& path) {
  SafetensorsReader reader;
  std::error_code ec;
  std::vector<std::string> shard_paths;
  json weight_map;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    const fs::path index = p / INDEX_FILE;
    if (fs::exists(index, ec)) {
      std::ifstream in(index);
      const json parsed = json::parse(in, nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("weight_map") ||
          !parsed["weight_map"].is_object()) {
        return file_error(index.string(), "not a valid index (needs an object 'weight_map')");
      }
      weight_map = parsed["weight_map"];
      std::vector<std::string> names;
      for (const auto& [tensor, shard] : weight_map.items()) {
        if (!shard.is_string()) return file_error(index.string(), "weight_map['" + tensor + "'] is not a string");
        const std::string s = shard.get<std::string>();
        if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..")
          return file_error(index.string(), "weight_map['" + tensor + "'] names an invalid shard '" + s + "'");
        if (std::find(names.begin(), names.end(), s) == names.end()) names.push_back(s);
      }
      std::sort(names.begin(), names.end());
      for (const std::string& s : names) shard_paths.push_back((p / s).string());
    } else if (fs::exists(p / "model.safetensors", ec)) {
      shard_paths.push_back((p / "model.safetensors").string());
    } else {
      return file_error(path, "no model.safetensors or " + std::string(INDEX_FILE) + " in this folder");
    }
  } else {
    shard_paths.push_back(path);
  }

  for (const std::string& shard : shard_paths) {
    Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(shard);
    if (!file) return file.status();
    reader.files_.push_back(std::move(file.value()));
    const SafetensorsFile* f = reader.files_.back().get();
    for (const TensorInfo& t : f->header().tensors) {
      if (reader.tensors_.count(t.name)) {
        return file_error(shard, "tensor '" + t.name + "' also appears in " + reader.tensors_.at(t.name).file->path());
      }
      reader.tensors_.emplace(t.name, Entry{f, &t});
    }
  }
  if (!weight_map.is_null()) {
    for (const auto& [tensor, shard] : weight_map.items()) {
      auto it = reader.tensors_.find(tensor);
      if (it == reader.tensors_.end() || fs::path(it->second.file->path()).filename() != shard.get<std::string>()) {
        return file_error((p / INDEX_FILE).string(), "index maps tensor '" + tensor + "' to " +
                                                         shard.get<std::string>() + ", which does not hold it");
      }
    }
    if (weight_map.size() != reader.tensors_.size()) {
      for (const auto& [name, entry] : reader.tensors_) {
        if (!weight_map.contains(name))
          return file_error(entry.file->path(), "tensor '" + name + "' is not listed in the index");
      }
    }
  }
  return reader;
}

const SafetensorsReader::Entry* SafetensorsReader::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

uint64_t SafetensorsReader::total_file_bytes() const {
  uint64_t total = 0;
  for (const auto& f : files_) total += f->file_size();
  return total;
}

// ---- ShardedWriter -----------------------------------------------------------------------------

Result<std::unique_ptr<ShardedWriter>> ShardedWriter::create(const std::string& dir, std::vector<TensorSpec> tensors,
                                                             uint64_t max_shard_bytes,
                                                             std::map<std::string, std::string> metadata) {
  std::unique_ptr<ShardedWriter> writer(new ShardedWriter());
  writer->dir_ = dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return file_error(dir, "cannot create folder: " + ec.message());

  // Group into shards in the given order, then lay out each shard's data by descending element
  // size (as the reference writer does, so every tensor stays naturally aligned).
  std::vector<std::vector<TensorSpec>> groups(1);
  uint64_t group_bytes = 0;
  for (TensorSpec& t : tensors) {
    if (!groups.back().empty() && group_bytes + t.nbytes() > max_shard_bytes) {
      groups.emplace_back();
      group_bytes = 0;
    }
    group_bytes += t.nbytes();
    groups.back().push_back(std::move(t));
  }
  const size_t n_shards = groups.size();
  for (size_t s = 0; s < n_shards; ++s) {
    auto& group = groups[s];
    std::stable_sort(group.begin(), group.end(), [](const TensorSpec& a, const TensorSpec& b) {
      return dtype_size(a.dtype) > dtype_size(b.dtype);
    });
    json header = json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    uint64_t offset = 0;
    for (const TensorSpec& t : group) {
      header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                        {"shape", t.shape},
                        {"data_offsets", {offset, offset + t.nbytes()}}};
      offset += t.nbytes();
    }
    std::string header_text = header.dump();
    header_text.append((8 - header_text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
    char shard_name[64];
    std::snprintf(shard_name, sizeof shard_name, "model-%05zu-of-%05zu.safetensors", s + 1, n_shards);
    const std::string name = n_shards == 1 ? "model.safetensors" : shard_name;
    Shard shard;
    shard.path = (fs::path(dir) / name).string();
    shard.fd = ::open(shard.path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (shard.fd < 0) return file_error(shard.path, std::string("cannot create: ") + std::strerror(errno));
    writer->shards_.push_back(shard);  // closed by the destructor from here on
    std::string head(8, '\0');
    for (int i = 0; i < 8; ++i) head[i] = static_cast<char>(header_text.size() >> (8 * i));
    head += header_text;
    const uint64_t file_size = head.size() + offset;
    if (pwrite(shard.fd, head.data(), head.size(), 0) != static_cast<ssize_t>(head.size()) ||
        ftruncate(shard.fd, static_cast<off_t>(file_size)) != 0) {
      return file_error(shard.path, std::string("cannot write: ") + std::strerror(errno));
    }
    uint64_t data_offset = 8 + header_text.size();
    for (const TensorSpec& t : group) {
      TensorInfo info{t.name, t.dtype, t.shape, data_offset, t.nbytes()};
      writer->placement_[t.name] = {writer->shards_.size() - 1, std::move(info)};
      data_offset += t.nbytes();
    }
    writer->shard_names_.push_back(name);
  }
  return writer;
}

Status ShardedWriter::write(std::string_view name, std::span<const uint8_t> bytes) {
  auto it = placement_.find(name);
  if (it == placement_.end()) return Status::error(dir_ + ": no tensor '" + std::string(name) + "' in the layout");
  const auto& [shard, info] = it->second;
  if (bytes.size() != info.nbytes) {
    return Status::error(dir_ + ": tensor '" + std::string(name) + "' has " + std::to_string(info.nbytes) +
                         " bytes, got " + std::to_string(bytes.size()));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        pwrite(shards_[shard].fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(info.data_begin + done));
    if (n <= 0) return file_error(shards_[shard].path, std::string("cannot write: ") + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  // Start the disk write of this range now (asynchronously), so writing overlaps generating and
  // finish() has little left to wait for; left alone, the kernel would hold it dirty much longer.
  sync_file_range(shards_[shard].fd, static_cast<off_t>(info.data_begin), static_cast<off_t>(bytes.size()),
                  SYNC_FILE_RANGE_WRITE);
  return Status::ok();
}

Status ShardedWriter::finish() {
  Status status;
  for (Shard& shard : shards_) {
    if (shard.fd >= 0 && fdatasync(shard.fd) != 0 && status.is_ok())
      status = file_error(shard.path, std::string("cannot write: ") + std::strerror(errno));
    if (shard.fd >= 0) ::close(shard.fd);
    shard.fd = -1;
  }
  NIB_RETURN_IF_ERROR(status);
  if (shards_.size() == 1) return Status::ok();
  json index;
  uint64_t total = 0;
  json weight_map = json::object();
  for (const auto& [name, placed] : placement_) {
    weight_map[name] = shard_names_[placed.first];
    total += placed.second.nbytes;
  }
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  const std::string path = (fs::path(dir_) / INDEX_FILE).string();
  std::ofstream out(path);
  out << index.dump(2) << "\n";
  if (!out) return file_error(path, "cannot write index");
  return Status::ok();
}

ShardedWriter::~ShardedWriter() {
  for (Shard& shard : shards_)
    if (shard.fd >= 0) ::close(shard.fd);
}

}  // namespace nibble::io
