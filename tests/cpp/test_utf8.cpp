// text/utf8.h's code point reader against the encoder and against every kind of malformed input:
// valid sequences decode to what append_utf8 wrote; any byte that starts no valid sequence (invalid,
// overlong, surrogate, or cut short by the end of the string) reads as U+FFFD and one byte.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "test_seed.h"
#include "text/utf8.h"

namespace {

using nibble::text::append_utf8;
using nibble::text::next_code_point;
using nibble::text::utf8_valid;

TEST(Utf8, CodePointsReadBackAsWritten) {
  std::mt19937_64 rng(nibble::test::test_seed("Utf8.CodePointsReadBackAsWritten"));
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint32_t> cps;
    std::string s;
    for (int n = 1 + int(rng() % 12); n > 0; --n) {
      // Each encoded length equally often; never a surrogate (not a scalar value).
      const uint32_t limits[4] = {0x80, 0x800, 0x10000, 0x110000}, floors[4] = {0, 0x80, 0x800, 0x10000};
      const int len = int(rng() % 4);
      uint32_t cp;
      do cp = floors[len] + uint32_t(rng() % (limits[len] - floors[len]));
      while (cp >= 0xD800 && cp <= 0xDFFF);
      cps.push_back(cp);
      append_utf8(s, cp);
    }
    ASSERT_TRUE(utf8_valid(s));
    std::vector<uint32_t> got;
    for (size_t i = 0; i < s.size();) got.push_back(next_code_point(s, i));
    EXPECT_EQ(got, cps) << "trial " << trial;
  }
}

TEST(Utf8, MalformedBytesReadAsReplacementOneByteAtATime) {
  const std::vector<std::string> malformed = {
      "\x80",              // a continuation byte alone
      "\xC0\xAF",          // overlong (C0, C1 never lead)
      "\xE0\x80\xAF",      // overlong three-byte form
      "\xED\xA0\x80",      // a UTF-16 surrogate
      "\xF4\x90\x80\x80",  // past U+10FFFF
      "\xF5\x80\x80\x80",  // F5–FF never lead
      "\xFF",
      "\xC3",          // cut short by the end: two-byte lead
      "\xE2\x82",      // three-byte lead and one continuation
      "\xF0\x9F\x98",  // four-byte lead and two continuations
  };
  for (const std::string& bad : malformed) {
    // Alone, after a valid character, and before one: every byte of it a U+FFFD, then the character.
    const std::string s = "\xC3\xA9" + bad + "z";
    std::vector<uint32_t> got;
    size_t i = 0;
    while (i < s.size()) {
      got.push_back(next_code_point(s, i));
      ASSERT_LE(i, s.size());
    }
    std::vector<uint32_t> want = {0xE9};
    want.insert(want.end(), bad.size(), 0xFFFD);
    want.push_back('z');
    EXPECT_EQ(got, want) << "bytes of length " << bad.size();
    // Last in the string (a sequence cut short there once read past its end): U+FFFD, one byte.
    std::string tail = "a" + bad;
    size_t j = 1;
    EXPECT_EQ(next_code_point(tail, j), 0xFFFDu);
    EXPECT_EQ(j, 2u);
  }
}

}  // namespace
