// UTF-8 per RFC 3629 / Unicode Table 3-7 (well-formed byte sequences).
#include "text/utf8.h"

namespace nibble::text {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

int utf8_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t lead = b(i);
  if (lead < 0x80) return 1;
  int n;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Table 3-7)
  if (lead >= 0xC2 && lead <= 0xDF)
    n = 2;
  else if (lead == 0xE0)
    n = 3, lo = 0xA0;
  else if (lead >= 0xE1 && lead <= 0xEC)
    n = 3;
  else if (lead == 0xED)
    n = 3, hi = 0x9F;
  else if (lead >= 0xEE && lead <= 0xEF)
    n = 3;
  else if (lead == 0xF0)
    n = 4, lo = 0x90;
  else if (lead >= 0xF1 && lead <= 0xF3)
    n = 4;
  else if (lead == 0xF4)
    n = 4, hi = 0x8F;
  else
    return 0;
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -1;
    const uint8_t c = b(i + k);
    if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return 0;
  }
  return n;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const int n = utf8_sequence_length(bytes, i);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
      continue;
    }
    // Maximal subpart: skip the lead byte and the continuation bytes that were still valid.
    size_t k = i + 1;
    while (k < bytes.size() && k - i < 4) {
      const int partial = utf8_sequence_length(bytes.substr(0, k + 1), i);
      if (partial != -1) break;  // k is no longer a valid continuation
      ++k;
    }
    out += "\xEF\xBF\xBD";
    i = k;
  }
  return out;
}

uint32_t next_code_point(std::string_view s, size_t& i) {
  const int n = utf8_sequence_length(s, i);
  if (n <= 0) {  // not a valid sequence here, or one cut short by the end: never read past s
    ++i;
    return 0xFFFD;
  }
  const uint8_t lead = static_cast<uint8_t>(s[i]);
  uint32_t cp = n == 1 ? lead : n == 2 ? lead & 0x1F : n == 3 ? lead & 0x0F : lead & 0x07;
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

bool utf8_valid(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const int n = utf8_sequence_length(bytes, i);
    if (n <= 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace nibble::text
