// The checksum of format-3 directories (format/checksum.h): the AVX2 build, where the CPU runs
// it, gives the library's XXH3-64 for every length and alignment; content_checksum keeps XXH64
// for the versions that wrote it.
#include "format/checksum.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

#include "format/engine_dir.h"

namespace ms {
namespace {

TEST(Checksum, Xxh3IsTheLibrarysAtEveryLengthAndAlignment) {
  std::mt19937 gen(7);
  std::vector<uint8_t> buf((size_t(1) << 21) + 64);
  for (auto& b : buf) b = uint8_t(gen());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 1100; ++n) lengths.push_back(n);
  for (size_t n : {4095, 4096, 4097, 65536, 1769472, 1 << 21}) lengths.push_back(n);
  for (size_t n : lengths)
    for (size_t at : {0, 1, 3, 8, 33})
      ASSERT_EQ(xxh3_64(buf.data() + at, n), XXH3_64bits(buf.data() + at, n)) << n << " bytes at " << at;
}

TEST(Checksum, EachVersionKeepsItsHash) {
  const std::vector<uint8_t> bytes = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(content_checksum(1, bytes.data(), bytes.size()), XXH64(bytes.data(), bytes.size(), 0));
  EXPECT_EQ(content_checksum(2, bytes.data(), bytes.size()), XXH64(bytes.data(), bytes.size(), 0));
  EXPECT_EQ(content_checksum(3, bytes.data(), bytes.size()), XXH3_64bits(bytes.data(), bytes.size()));
}

}  // namespace
}  // namespace ms
