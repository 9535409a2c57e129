// UTF-8 helpers for the tokenizer and the streaming detokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace nibble::text {

// Appends the UTF-8 encoding of a code point.
void append_utf8(std::string& out, uint32_t code_point);

// Length of the valid UTF-8 sequence starting at s[i] (1..4), 0 if it is invalid there, or -1 if
// s ends inside a sequence that is valid so far (more bytes may complete it).
int utf8_sequence_length(std::string_view s, size_t i);

// Decodes bytes as UTF-8, replacing each maximal invalid subsequence with U+FFFD, exactly as
// Rust's String::from_utf8_lossy (which Hugging Face tokenizers' decoders use) does.
std::string utf8_lossy(std::string_view bytes);

// Whether all of bytes is valid UTF-8.
bool utf8_valid(std::string_view bytes);

// Decodes the code point at s[i] and advances i past it. Where no valid sequence starts at s[i] (an
// invalid byte, or a sequence the end of s cuts short: bytes from a raw template file, say) it
// returns U+FFFD and advances one byte, so a loop over s visits every byte and reads none past it.
uint32_t next_code_point(std::string_view s, size_t& i);

}  // namespace nibble::text
