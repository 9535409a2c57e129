// Tokenizer implementation, following huggingface/tokenizers (tokenizers/src): added-token
// extraction (leftmost-longest), normalizers, pre-tokenizers, BPE merges by rank, ByteLevel decoder.
#include "text/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "text/pre_tokenizer.h"
#include "text/sentencepiece_model.h"
#include "text/utf8.h"

namespace nibble::text {
namespace {

using json = nlohmann::json;

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 onwards.
std::array<uint32_t, 256> byte_to_code_point() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    map[b] = printable ? b : next++;
  }
  return map;
}

// The bytes of a SentencePiece piece as transformers' converted decoder gives them: "▁" is a
// space, byte pieces (<0x00> … <0xFF>) are their byte (Replace, ByteFallback; convert_slow_tokenizer.py).
std::string sentencepiece_piece_bytes(const SentencePieceModel& spm, int32_t id) {
  if (id >= spm.size()) return {};
  const std::string& piece = spm.piece(id);
  if (spm.is_byte(id)) return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 3;
    } else {
      out += piece[i++];
    }
  }
  return out;
}

}  // namespace

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;  // byte-level token strings
  std::vector<std::string> id_to_token;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) → (rank, merged id)
  bool ignore_merges = false;
  int32_t unk_id = -1;
  std::array<int32_t, 256> byte_token{};  // id of each byte's one-character token
  std::array<uint32_t, 256> byte_cp = byte_to_code_point();
  std::unordered_map<uint32_t, uint8_t> cp_byte;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  std::vector<std::string> normalizers;  // "NFC", "NFKC", "NFD", "NFKD"
  std::vector<PreTokenizerStep> pre;
  std::vector<int32_t> post_prefix, post_suffix;  // TemplateProcessing around sequence A
  // A SentencePiece tokenizer.model in place of tokenizer.json's model (ERNIE-4.5); legacy as
  // tokenizer_config.json's "legacy" (transformers' default true): every chunk between added tokens
  // gets the dummy prefix, else only a chunk that starts the text.
  std::unique_ptr<SentencePieceModel> spm;
  bool spm_legacy = true;
  // Each id's bytes in decode (ByteLevel or SentencePiece decoder), made once at load: streaming
  // detokenization looks them up per generated token. One byte string and an offset per id (id's
  // bytes are [id_begin[id], id_begin[id + 1]) of id_blob), and a special flag per id: a lookup
  // touches 4 + 4 + 1 bytes of tables of 0.6 + 0.15 MB (Qwen3), where a std::string per id and the
  // added tokens' hash map cost two cache misses (bench_engine, 256 sequences: 23% of the engine's time).
  std::string id_blob;
  std::vector<uint32_t> id_begin;
  std::vector<uint8_t> id_special;
  void build_id_bytes() {
    id_blob.clear();
    id_begin.assign(id_to_token.size() + 1, 0);
    id_special.assign(id_to_token.size(), 0);
    for (size_t id = 0; id < id_to_token.size(); ++id) {
      id_begin[id] = static_cast<uint32_t>(id_blob.size());
      id_blob += bytes_of(static_cast<int32_t>(id));
    }
    id_begin.back() = static_cast<uint32_t>(id_blob.size());
    for (const AddedToken& a : added)
      if (a.special && static_cast<size_t>(a.id) < id_special.size()) id_special[a.id] = 1;
  }
  std::string bytes_of(int32_t id) const {
    const std::string& token = id_to_token[id];
    if (spm && !added_by_id.contains(id)) return sentencepiece_piece_bytes(*spm, id);
    // ByteLevel decoder: map each character back to its byte; a token with a character outside the
    // byte alphabet (an added token such as "<think>\n") contributes its UTF-8 bytes unchanged.
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      auto it = cp_byte.find(next_code_point(token, i));
      if (it == cp_byte.end()) return token;
      bytes += static_cast<char>(it->second);
    }
    return bytes;
  }
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  // Unicode normalization by length, not as a NUL-terminated string: a prompt may contain NUL and
  // every byte after it must survive (utf8proc's NFC()/NFKC() shortcuts stop at the first NUL).
  std::string normalize(const std::string& s) const {
    std::string out = s;
    for (const std::string& form : normalizers) {
      int options = UTF8PROC_STABLE;
      if (form == "NFC")
        options |= UTF8PROC_COMPOSE;
      else if (form == "NFD")
        options |= UTF8PROC_DECOMPOSE;
      else if (form == "NFKC")
        options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      else
        options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      utf8proc_uint8_t* r = nullptr;
      const utf8proc_ssize_t n =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(out.data()), static_cast<utf8proc_ssize_t>(out.size()),
                       &r, static_cast<utf8proc_option_t>(options));
      if (n < 0) continue;  // invalid UTF-8 cannot reach here (input is validated) but stay safe
      out.assign(reinterpret_cast<char*>(r), static_cast<size_t>(n));
      free(r);
    }
    return out;
  }

  // BPE over one pre-token's bytes.
  void bpe(const std::string& word, std::vector<int32_t>& out) const {
    {
      std::lock_guard<std::mutex> lock(cache_mutex);
      auto it = cache.find(word);
      if (it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids;
    std::string mapped;
    for (unsigned char c : word) append_utf8(mapped, byte_cp[c]);
    auto whole = ignore_merges ? vocab.find(mapped) : vocab.end();
    if (whole != vocab.end()) {
      ids.push_back(whole->second);
    } else {
      for (unsigned char c : word) ids.push_back(byte_token[c] >= 0 ? byte_token[c] : unk_id);
      std::erase(ids, -1);
      while (ids.size() > 1) {
        int32_t best_rank = INT32_MAX, merged = -1;
        size_t best = 0;
        for (size_t i = 0; i + 1 < ids.size(); ++i) {
          auto it = merges.find(static_cast<uint64_t>(static_cast<uint32_t>(ids[i])) << 32 |
                                static_cast<uint32_t>(ids[i + 1]));
          if (it != merges.end() && it->second.first < best_rank) {
            best_rank = it->second.first;
            merged = it->second.second;
            best = i;
          }
        }
        if (merged < 0) break;
        ids[best] = merged;
        ids.erase(ids.begin() + static_cast<long>(best) + 1);
      }
    }
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() > 200000) cache.clear();
    cache.emplace(word, std::move(ids));
  }

  // Splits text into (segment, added token id or -1) around added-token matches, leftmost-longest.
  void split_added(const std::string& text, bool parse_special, bool normalized_phase,
                   std::vector<std::pair<std::string, int32_t>>& out) const {
    size_t start = 0, i = 0;
    while (i < text.size()) {
      const AddedToken* best = nullptr;
      for (const AddedToken& t : added) {
        if (t.normalized != normalized_phase || (t.special && !parse_special)) continue;
        if (t.content.empty() || text.compare(i, t.content.size(), t.content) != 0) continue;
        if (t.single_word) {
          auto word_char = [](unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; };
          if ((i > 0 && word_char(text[i - 1])) ||
              (i + t.content.size() < text.size() && word_char(text[i + t.content.size()])))
            continue;
        }
        if (!best || t.content.size() > best->content.size()) best = &t;
      }
      if (!best) {
        ++i;
        continue;
      }
      size_t match_begin = i, match_end = i + best->content.size();
      if (best->lstrip)
        while (match_begin > start && std::isspace(static_cast<unsigned char>(text[match_begin - 1]))) --match_begin;
      if (best->rstrip)
        while (match_end < text.size() && std::isspace(static_cast<unsigned char>(text[match_end]))) ++match_end;
      if (match_begin > start) out.emplace_back(text.substr(start, match_begin - start), -1);
      out.emplace_back(std::string(), best->id);
      start = i = match_end;
    }
    if (start < text.size()) out.emplace_back(text.substr(start), -1);
  }

  void encode_segment(const std::string& segment, std::vector<int32_t>& out) const {
    for (const std::string& p : pre_tokenize(segment, pre)) bpe(p, out);
  }
};

namespace {

// tokenizer_config.json's special-token fields are a string or an AddedToken object.
std::string token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object()) return v.value("content", "");
  return {};
}

Status load_normalizer(const json& n, std::vector<std::string>& out) {
  if (n.is_null()) return Status::ok();
  const std::string type = n.value("type", "");
  if (type == "Sequence") {
    for (const json& child : n.value("normalizers", json::array())) NIB_RETURN_IF_ERROR(load_normalizer(child, out));
    return Status::ok();
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    out.push_back(type);
    return Status::ok();
  }
  return Status::error("normalizer '" + type + "' is not supported (supported: NFC, NFD, NFKC, NFKD, Sequence)");
}

Status load_post_processor(const json& p, std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  if (p.is_null()) return Status::ok();
  const std::string type = p.value("type", "");
  if (type == "ByteLevel") return Status::ok();  // offsets only
  if (type == "Sequence") {
    for (const json& child : p.value("processors", json::array()))
      NIB_RETURN_IF_ERROR(load_post_processor(child, prefix, suffix));
    return Status::ok();
  }
  if (type != "TemplateProcessing") {
    return Status::error("post-processor '" + type +
                         "' is not supported (supported: ByteLevel, TemplateProcessing, Sequence)");
  }
  const json& special = p.value("special_tokens", json::object());
  bool after_sequence = false;
  for (const json& item : p.value("single", json::array())) {
    if (item.contains("Sequence")) {
      after_sequence = true;
      continue;
    }
    const std::string name = item["SpecialToken"].value("id", "");
    if (!special.contains(name)) return Status::error("TemplateProcessing names unknown special token '" + name + "'");
    for (const json& id : special[name].value("ids", json::array()))
      (after_sequence ? suffix : prefix).push_back(id.get<int32_t>());
  }
  return Status::ok();
}

}  // namespace

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

// A folder with tokenizer.model and no tokenizer.json, read as transformers 5 reads one
// (TokenizersBackend._convert_from_sentencepiece): the SentencePiece model, with the added tokens,
// "legacy", add_bos_token and add_eos_token of tokenizer_config.json.
Result<std::unique_ptr<Tokenizer>> Tokenizer::load_sentencepiece(const std::string& dir) {
  auto spm = SentencePieceModel::load(dir + "/tokenizer.model");
  if (!spm) return spm.status();
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  Impl& m = *tok->impl_;
  m.spm = std::move(*spm);
  m.id_to_token.resize(static_cast<size_t>(m.spm->size()));
  for (int32_t id = 0; id < m.spm->size(); ++id) {
    m.id_to_token[id] = m.spm->piece(id);
    m.vocab.emplace(m.id_to_token[id], id);
  }
  m.unk_id = m.spm->unk_id();
  const std::string config_file = dir + "/tokenizer_config.json";
  std::ifstream in(config_file);
  if (!in) {  // the model alone: no added tokens
    m.build_id_bytes();
    return tok;
  }
  const json config = json::parse(in, nullptr, false);
  if (config.is_discarded() || !config.is_object()) return Status::error(config_file + ": not valid JSON");
  const json added = config.value("added_tokens_decoder", json::object());
  for (const auto& [key, t] : added.items()) {
    // Matched on the raw text: SentencePiece normalizes each chunk between them by itself.
    AddedToken a{std::stoi(key),           t.value("content", ""),   t.value("special", false),
                 t.value("lstrip", false), t.value("rstrip", false), t.value("single_word", false),
                 /*normalized=*/false};
    if (a.id < 0 || a.content.empty()) return Status::error(config_file + ": added token " + key + " without content");
    if (static_cast<size_t>(a.id) >= m.id_to_token.size()) m.id_to_token.resize(static_cast<size_t>(a.id) + 1);
    m.id_to_token[a.id] = a.content;
    m.added_by_id[a.id] = m.added.size();
    m.added.push_back(a);
  }
  m.spm_legacy = config.value("legacy", true);
  for (const auto& [flag, name, ids] : {std::tuple{"add_bos_token", "bos_token", &m.post_prefix},
                                        std::tuple{"add_eos_token", "eos_token", &m.post_suffix}}) {
    if (!config.value(flag, false)) continue;
    const int32_t id = tok->token_to_id(token_content(config.value(name, json())));
    if (id < 0) return Status::error(config_file + ": " + flag + " is set but " + name + " is not in the vocabulary");
    ids->push_back(id);
  }
  m.build_id_bytes();
  return tok;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::load_unchecked(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) {
    file = path + "/tokenizer.json";
    if (!std::filesystem::exists(file) && std::filesystem::exists(path + "/tokenizer.model"))
      return load_sentencepiece(path);
  }
  std::ifstream in(file);
  if (!in) return Status::error(file + ": cannot open");
  const json root = json::parse(in, nullptr, false);
  if (root.is_discarded() || !root.is_object()) return Status::error(file + ": not valid JSON");
  auto fail = [&](const std::string& what) { return Status::error(file + ": " + what); };

  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  Impl& m = *tok->impl_;
  const json& model = root.value("model", json::object());
  if (model.value("type", "") != "BPE")
    return fail("model type '" + model.value("type", "") + "' is not supported (BPE only)");
  if (model.value("byte_fallback", false)) return fail("BPE byte_fallback is not supported (byte-level BPE only)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = model.value(key, json());
    if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty()))
      return fail(std::string("BPE ") + key + " is not supported (byte-level BPE has none)");
  }
  m.ignore_merges = model.value("ignore_merges", false);
  const json vocab = model.value("vocab", json::object());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      return fail("vocab id of '" + token + "' is not a non-negative integer");
    m.vocab[token] = id.get<int32_t>();
  }
  for (const json& t : root.value("added_tokens", json::array())) {
    AddedToken a{t.value("id", -1),           t.value("content", ""),   t.value("special", false),
                 t.value("lstrip", false),    t.value("rstrip", false), t.value("single_word", false),
                 t.value("normalized", false)};
    if (a.id < 0 || a.content.empty()) return fail("added token without id or content");
    m.added_by_id[a.id] = m.added.size();
    m.added.push_back(a);
  }
  int32_t max_id = -1;
  for (const auto& [s, id] : m.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& a : m.added) max_id = std::max(max_id, a.id);
  m.id_to_token.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [s, id] : m.vocab) m.id_to_token[id] = s;
  for (const AddedToken& a : m.added) m.id_to_token[a.id] = a.content;

  for (int b = 0; b < 256; ++b) {
    m.cp_byte[m.byte_cp[b]] = static_cast<uint8_t>(b);
    std::string ch;
    append_utf8(ch, m.byte_cp[b]);
    auto it = m.vocab.find(ch);
    m.byte_token[b] = it == m.vocab.end() ? -1 : it->second;
  }
  if (model.contains("unk_token") && model["unk_token"].is_string())
    m.unk_id = tok->token_to_id(model["unk_token"].get<std::string>());

  int32_t rank = 0;
  for (const json& merge : model.value("merges", json::array())) {
    std::string a, b;
    if (merge.is_string()) {  // "a b"
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos) return fail("merge '" + s + "' is not two tokens");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      a = merge[0].get<std::string>();
      b = merge[1].get<std::string>();
    } else {
      return fail("merge #" + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
    }
    auto ia = m.vocab.find(a), ib = m.vocab.find(b), im = m.vocab.find(a + b);
    if (ia == m.vocab.end() || ib == m.vocab.end() || im == m.vocab.end())
      return fail("merge '" + a + " " + b + "' uses a token missing from the vocab");
    const uint64_t key =
        static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32 | static_cast<uint32_t>(ib->second);
    m.merges.emplace(key, std::make_pair(rank++, im->second));
  }

  NIB_RETURN_IF_ERROR([&]() -> Status {
    Status s = load_normalizer(root.value("normalizer", json()), m.normalizers);
    if (s) s = load_pre_tokenizer(root.value("pre_tokenizer", json()), m.pre);
    if (s) s = load_post_processor(root.value("post_processor", json()), m.post_prefix, m.post_suffix);
    const json& decoder = root.value("decoder", json());
    if (s && !decoder.is_null() && decoder.value("type", "") != "ByteLevel")
      s = Status::error("decoder '" + decoder.value("type", "") + "' is not supported (ByteLevel only)");
    return s ? s : fail(s.message());
  }());
  m.build_id_bytes();
  return tok;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special, bool add_special_tokens) const {
  const Impl& m = *impl_;
  const std::string input = utf8_lossy(text);  // invalid bytes become U+FFFD, as a Python str would hold
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = m.post_prefix;
  std::vector<std::pair<std::string, int32_t>> raw_parts;
  m.split_added(input, parse_special, /*normalized_phase=*/false, raw_parts);
  for (size_t part = 0; part < raw_parts.size(); ++part) {
    const auto& [segment, id] = raw_parts[part];
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    if (m.spm) {  // SentencePiece normalizes each chunk itself
      // Not legacy: transformers' Metaspace prepends only where the normalized text still starts at
      // offset 0 of the input, so not after leading whitespace (which the normalizer removes).
      const bool at_text_start = part == 0 && !std::isspace(static_cast<unsigned char>(segment[0]));
      m.spm->encode(segment, /*with_dummy_prefix=*/m.spm_legacy || at_text_start, ids);
      continue;
    }
    std::vector<std::pair<std::string, int32_t>> parts;
    m.split_added(m.normalize(segment), parse_special, /*normalized_phase=*/true, parts);
    for (auto& [piece, piece_id] : parts) {
      if (piece_id >= 0)
        ids.push_back(piece_id);
      else
        m.encode_segment(piece, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), m.post_suffix.begin(), m.post_suffix.end());
  return ids;
}

std::string_view Tokenizer::token_bytes(int32_t id, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= m.id_special.size()) return {};
  if (skip_special_tokens && is_special(id)) return {};
  return std::string_view(m.id_blob).substr(m.id_begin[id], m.id_begin[id + 1] - m.id_begin[id]);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes, run;
  size_t run_pieces = 0;
  for (int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;  // skipped before decoding: a byte run goes on
    if (is_byte_piece(id)) {
      run += token_bytes(id);
      ++run_pieces;
      continue;
    }
    bytes += byte_run_text(run, run_pieces);
    bytes += token_bytes(id, skip_special_tokens);
    run.clear();
    run_pieces = 0;
  }
  bytes += byte_run_text(run, run_pieces);
  if (strips_leading_space() && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
  return utf8_lossy(bytes);
}

bool Tokenizer::strips_leading_space() const { return impl_->spm && impl_->spm->adds_dummy_prefix(); }

bool Tokenizer::is_byte_piece(int32_t id) const {
  return impl_->spm && id >= 0 && id < impl_->spm->size() && impl_->spm->is_byte(id) &&
         !impl_->added_by_id.contains(id);
}

std::string Tokenizer::byte_run_text(const std::string& bytes, size_t n_pieces) {
  if (utf8_valid(bytes)) return bytes;
  std::string out;
  for (size_t i = 0; i < n_pieces; ++i) out += "\xEF\xBF\xBD";  // U+FFFD
  return out;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_special.size() && impl_->id_special[id];
}

std::string Tokenizer::id_to_token(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_to_token.size() ? impl_->id_to_token[id] : std::string();
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->vocab.find(std::string(token));
  return it == impl_->vocab.end() ? -1 : it->second;
}

size_t Tokenizer::vocab_size() const { return impl_->id_to_token.size(); }

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& path) {
  try {  // fields of unexpected JSON types throw in nlohmann's accessors
    auto tok = load_unchecked(path);
    // A tokenizer.json converted from SentencePiece (byte-fallback BPE, Metaspace) beside the
    // tokenizer.model it came from: the model itself, as SentencePiece encodes.
    if (!tok && std::filesystem::is_directory(path) && std::filesystem::exists(path + "/tokenizer.model")) {
      auto spm = load_sentencepiece(path);
      if (spm) return spm;
    }
    return tok;
  } catch (const nlohmann::json::exception& e) {
    return Status::error(path + ": tokenizer: " + e.what());
  }
}

}  // namespace nibble::text
