// E2M1, E4M3 and BF16 codecs: every code round-trips, rounding follows the rules of docs/format.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"

using namespace nibble::formats;

TEST(E2M1, EveryCodeRoundTrips) {
  for (int code = 0; code < 16; ++code) {
    const float v = e2m1_decode(static_cast<uint8_t>(code));
    EXPECT_EQ(e2m1_encode(v), code) << "code " << code << " value " << v;
  }
}

TEST(E2M1, MidpointsRoundToEvenCode) {
  // Between two neighbours the code with mantissa bit 0 wins.
  const struct {
    float x;
    uint8_t code;
  } cases[] = {
      {0.25f, 0},      {0.75f, 2},      {1.25f, 2}, {1.75f, 4}, {2.5f, 4},   {3.5f, 6},    {5.0f, 6},   {0.2500001f, 1},
      {0.7499999f, 1}, {5.0000005f, 7}, {6.0f, 7},  {1e30f, 7}, {-0.25f, 8}, {-0.75f, 10}, {-5.0f, 14}, {-1e30f, 15},
  };
  for (const auto& c : cases) EXPECT_EQ(e2m1_encode(c.x), c.code) << c.x;
}

TEST(E2M1, SignOfZeroAndNaN) {
  EXPECT_EQ(e2m1_encode(-0.0f), 8);
  EXPECT_EQ(e2m1_encode(-0.1f), 8);
  EXPECT_EQ(e2m1_encode(NAN), 7);
  EXPECT_EQ(e2m1_encode(INFINITY), 7);
  EXPECT_EQ(e2m1_encode(-INFINITY), 15);
}

TEST(E2M1, PackingPutsEvenElementInLowNibble) {
  const uint8_t byte = e2m1_pack(0x3, 0xC);
  EXPECT_EQ(byte, 0xC3);
  EXPECT_EQ(e2m1_unpack(byte, 0), 0x3);
  EXPECT_EQ(e2m1_unpack(byte, 1), 0xC);
}

TEST(E4M3, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const float v = e4m3_decode(static_cast<uint8_t>(code));
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << code;
      continue;
    }
    EXPECT_EQ(e4m3_encode(v), code) << "code " << code << " value " << v;
  }
}

TEST(E4M3, KnownValues) {
  EXPECT_EQ(e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(e4m3_decode(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_decode(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_decode(0x38), 1.0f);
  EXPECT_EQ(e4m3_encode(1000.0f), 0x7E);  // saturates
  EXPECT_EQ(e4m3_encode(-1000.0f), 0xFE);
  EXPECT_EQ(e4m3_encode(INFINITY), 0x7E);
  EXPECT_EQ(e4m3_encode(NAN), 0x7F);
  EXPECT_EQ(e4m3_encode(std::ldexp(1.0f, -10)), 0x00);  // half the min subnormal: tie → 0
  EXPECT_EQ(e4m3_encode(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(e4m3_encode(std::ldexp(3.0f, -10)), 0x02);  // 1.5 units: tie → 2 (even)
  EXPECT_EQ(e4m3_encode(1.0625f), 0x38);                // 1 + 1/16: tie → even mantissa 0
  EXPECT_EQ(e4m3_encode(1.1875f), 0x3A);                // 1 + 3/16: tie → mantissa 2
}

TEST(BF16, RoundTripAndRounding) {
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    const uint16_t b = static_cast<uint16_t>(hi);
    const float v = bf16_decode(b);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(bf16_decode(bf16_encode(v))));
      continue;
    }
    EXPECT_EQ(bf16_encode(v), b);
  }
  EXPECT_EQ(bf16_encode(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie → even
  EXPECT_EQ(bf16_encode(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
}
