#include "experts/io_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "test_support.h"

namespace ms {
namespace {

constexpr size_t kRecord = 3 * 4096;

std::string write_file(int records) {
  std::string path = test::scratch_dir("io") + "/blob.bin";
  std::ofstream out(path, std::ios::binary);
  for (int r = 0; r < records; ++r)
    for (size_t i = 0; i < kRecord; ++i) out.put(char((r * 31 + i * 7) & 0xff));
  return path;
}

// registered: the first half of the buffer, and a record straddling its end, is registered
// memory (io_uring reads the records that lie inside it as fixed buffers).
void check_engine(IoKind kind, bool direct, bool registered = false) {
  const int records = 40;
  std::string path = write_file(records);
  int fd = open(path.c_str(), O_RDONLY | (direct ? O_DIRECT : 0));
  ASSERT_GE(fd, 0) << std::strerror(errno);
  auto engine = make_io_engine(kind, 8);
  uint8_t* buf = static_cast<uint8_t*>(std::aligned_alloc(4096, kRecord * records));
  if (registered) {
    const size_t half = kRecord * records / 2 + 4096;  // ends inside record 20
    const uint64_t got = engine->register_memory({{buf, half}});
    EXPECT_EQ(got, std::string(engine->name()) == "io_uring" ? half : 0u) << engine->name();
    EXPECT_EQ(engine->registered_bytes(), got);
    EXPECT_EQ(engine->register_memory({{buf, half}}), 0u) << "registers once";
  }
  std::vector<ReadOp> ops;
  std::mt19937 rng(1);
  std::vector<int> order(records);
  for (int i = 0; i < records; ++i) order[size_t(i)] = (i * 17) % records;  // scattered
  for (int i = 0; i < records; ++i) ops.push_back({fd, uint64_t(order[size_t(i)]) * kRecord, kRecord, buf + size_t(i) * kRecord});
  engine->read_all(ops);
  for (int i = 0; i < records; ++i) {
    ASSERT_EQ(ops[size_t(i)].result, int64_t(kRecord)) << engine->name();
    const uint8_t* rec = buf + size_t(i) * kRecord;
    for (size_t b = 0; b < kRecord; b += 511) ASSERT_EQ(rec[b], uint8_t((order[size_t(i)] * 31 + b * 7) & 0xff));
  }
  // Records 0..19 lie inside the registered memory; 20 straddles its end and is read as others.
  EXPECT_EQ(engine->counters().fixed_reads, engine->registered_bytes() ? 20u : 0u);
  if (registered) {
    EXPECT_EQ(engine->register_memory({{buf + kRecord * records / 2, 4096}}), 0u) << "after reads";
  }
  // Past the end: a short read, reported as such, not as success.
  std::vector<ReadOp> tail{{fd, uint64_t(records - 1) * kRecord, 2 * kRecord, buf}};
  engine->read_all(tail);
  EXPECT_EQ(tail[0].result, int64_t(kRecord));
  close(fd);
  std::vector<ReadOp> bad{{fd, 0, 4096, buf}};  // closed descriptor
  engine->read_all(bad);
  EXPECT_LT(bad[0].result, 0);
  std::free(buf);
}

TEST(IoEngine, UringReadsScatteredRecordsWithODirect) { check_engine(IoKind::Uring, true); }
TEST(IoEngine, UringThroughThePageCache) { check_engine(IoKind::Uring, false); }
TEST(IoEngine, PreadFallbackWithODirect) { check_engine(IoKind::Pread, true); }
TEST(IoEngine, AutoPicksAWorkingEngine) { check_engine(IoKind::Auto, true); }
TEST(IoEngine, UringReadsIntoRegisteredBuffers) { check_engine(IoKind::Uring, true, true); }
TEST(IoEngine, UringRegisteredBuffersThroughThePageCache) { check_engine(IoKind::Uring, false, true); }
TEST(IoEngine, PreadIgnoresRegisteredMemory) { check_engine(IoKind::Pread, true, true); }

}  // namespace
}  // namespace ms
