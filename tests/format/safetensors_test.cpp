// safetensors reading: every dtype round trips through the writer, every malformed input is
// an ms::Error naming the file (and the tensor at fault), and a sharded checkpoint loads into
// the same model as the single-file one.
#include "format/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "backends/load.h"
#include "model/model.h"
#include "test_support.h"
#include "util/error.h"

namespace ms {
namespace {

using test::expect_error;

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::scratch_dir;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// A safetensors file as given: 8-byte little-endian header length, header text, data bytes.
std::string raw_file(const std::string& header, size_t data_bytes, uint64_t header_len = ~uint64_t(0)) {
  if (header_len == ~uint64_t(0)) header_len = header.size();
  std::string s(8, '\0');
  std::memcpy(s.data(), &header_len, 8);
  return s + header + std::string(data_bytes, '\x11');
}

std::string write_raw(const std::string& tag, const std::string& bytes) {
  std::string path = scratch_dir(tag) + "/bad.safetensors";
  write_bytes(path, bytes);
  return path;
}

template <class T>
TensorData make_tensor(const std::string& name, DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
  TensorData t{name, dt, std::move(shape), std::vector<uint8_t>(v.size() * sizeof(T))};
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

// ---- malformed files ----

TEST(Safetensors, MissingFileNamesPath) {
  std::string path = scratch_dir("missing") + "/nope.safetensors";
  expect_error([&] { SafetensorsFile f(path); }, {path, "cannot open"});
}

TEST(Safetensors, TruncatedFile) {
  std::string path = write_raw("trunc", std::string("\x05\0\0", 3));
  expect_error([&] { SafetensorsFile f(path); }, {path, "truncated", "3 bytes"});
  std::string empty = write_raw("trunc-empty", "");
  expect_error([&] { SafetensorsFile f(empty); }, {empty, "truncated", "0 bytes"});
}

TEST(Safetensors, HeaderLengthPastTheEnd) {
  std::string path = write_raw("hdrlen", raw_file("{}", 0, 1000));
  expect_error([&] { SafetensorsFile f(path); }, {path, "header length 1000", "past the end"});
  // A length that would wrap around when added to the file size.
  std::string huge = write_raw("hdrlen-huge", raw_file("{}", 0, ~uint64_t(0) - 4));
  expect_error([&] { SafetensorsFile f(huge); }, {huge, "past the end"});
}

TEST(Safetensors, MalformedJsonHeader) {
  std::string path = write_raw("json", raw_file("{\"a\": {\"dtype\": ", 0));
  expect_error([&] { SafetensorsFile f(path); }, {path, "header", "malformed JSON"});
  std::string arr = write_raw("json-array", raw_file("[1, 2]", 0));
  expect_error([&] { SafetensorsFile f(arr); }, {arr, "not an object"});
}

TEST(Safetensors, IncompleteHeaderEntry) {
  std::string path = write_raw("entry", raw_file(R"({"w": {"dtype": "F32", "shape": [1]}})", 4));
  expect_error([&] { SafetensorsFile f(path); }, {path, "'w'", "data_offsets"});
}

TEST(Safetensors, UnknownDtype) {
  std::string path = write_raw("dtype", raw_file(R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", 2));
  expect_error([&] { SafetensorsFile f(path); }, {path, "'w'", "unknown dtype", "F8_E4M3"});
}

TEST(Safetensors, BadShape) {
  std::string path = write_raw("shape", raw_file(R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}})", 8));
  expect_error([&] { SafetensorsFile f(path); }, {path, "'w'", "shape"});
}

TEST(Safetensors, DataOffsetsOutOfBounds) {
  std::string past = write_raw("oob", raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8));
  expect_error([&] { SafetensorsFile f(past); }, {past, "'w'", "out of bounds", "8 bytes"});
  std::string reversed = write_raw("oob-rev", raw_file(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 8));
  expect_error([&] { SafetensorsFile f(reversed); }, {reversed, "'w'", "out of bounds"});
  std::string neg = write_raw("oob-neg", raw_file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 8));
  expect_error([&] { SafetensorsFile f(neg); }, {neg, "'w'", "data_offsets"});
}

TEST(Safetensors, OverlappingTensors) {
  std::string path = write_raw("overlap", raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                                   12));
  expect_error([&] { SafetensorsFile f(path); }, {path, "'a'", "'b'", "overlap"});
}

TEST(Safetensors, EmptyTensorSharingAnOffsetIsNoOverlap) {
  // The writer gives a 0-byte tensor the offset where the next one begins.
  std::string path = scratch_dir("empty-offset") + "/m.safetensors";
  float one = 3.f;
  write_safetensors(path, {make_f32_tensor("z_empty", {0}, &one), make_f32_tensor("a", {1}, &one)});
  SafetensorsFile f(path);
  EXPECT_EQ(f.tensors().at("z_empty").nbytes, 0u);
  EXPECT_EQ(f.tensors().at("a").as<float>()[0], 3.f);
}

TEST(Safetensors, ShapeByteCountMismatch) {
  std::string path = write_raw("count", raw_file(R"({"w": {"dtype": "BF16", "shape": [3, 2], "data_offsets": [0, 8]}})", 8));
  expect_error([&] { SafetensorsFile f(path); }, {path, "'w'", "needs 12 bytes", "give 8"});
}

TEST(Safetensors, ShapeWhoseElementCountOverflows) {
  // 2^61 * 8 elements wraps a 64-bit count to 0, which must not pass as a 0-byte tensor.
  std::string path = write_raw(
      "overflow", raw_file(R"({"w": {"dtype": "F32", "shape": [2305843009213693952, 8], "data_offsets": [0, 0]}})", 0));
  expect_error([&] { SafetensorsFile f(path); }, {path, "'w'", "too large"});
}

TEST(Safetensors, HolesAndTrailingBytesAreRefused) {
  // Bytes no tensor owns: where anything could hide, and what the format forbids.
  std::string hole = write_raw("hole", raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                                    "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                                                12));
  expect_error([&] { SafetensorsFile f(hole); }, {hole, "'b'", "hole"});
  std::string first = write_raw("hole-first", raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8));
  expect_error([&] { SafetensorsFile f(first); }, {first, "'a'", "hole"});
  std::string tail = write_raw("tail", raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 5));
  expect_error([&] { SafetensorsFile f(tail); }, {tail, "trailing bytes", "5 bytes"});
  // Out of order in the header is fine as long as the extents tile the data.
  std::string order = write_raw("order", raw_file(R"({"z": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                                                     "a": {"dtype": "U8", "shape": [3], "data_offsets": [2, 5]}})",
                                                 5));
  EXPECT_EQ(SafetensorsFile(order).tensors().at("a").nbytes, 3u);
}

TEST(Safetensors, DuplicateNamesAndNonObjectEntriesAreRefused) {
  std::string dup = write_raw("dup", raw_file(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                                                  "w": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})",
                                              4));
  expect_error([&] { SafetensorsFile f(dup); }, {dup, "'w'", "twice"});
  std::string scalar = write_raw("scalar-entry", raw_file(R"({"w": 3})", 0));
  expect_error([&] { SafetensorsFile f(scalar); }, {scalar, "'w'", "header entry"});
  std::string list = write_raw("list-entry", raw_file(R"({"w": ["U8", [2], [0, 2]]})", 2));
  expect_error([&] { SafetensorsFile f(list); }, {list, "'w'", "header entry"});
  std::string meta = write_raw("meta-list", raw_file(R"({"__metadata__": ["pt"]})", 0));
  expect_error([&] { SafetensorsFile f(meta); }, {meta, "__metadata__"});
  std::string offs = write_raw("offs-3", raw_file(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 1, 2]}})", 2));
  expect_error([&] { SafetensorsFile f(offs); }, {offs, "'w'", "data_offsets"});
}

TEST(Safetensors, DeeplyNestedHeaderIsAnErrorNotACrash) {
  for (size_t depth : {300, 300000}) {
    SCOPED_TRACE(depth);
    const std::string text = "{\"w\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
    std::string path = write_raw("deep", raw_file(text, 0));
    expect_error([&] { SafetensorsFile f(path); }, {path, "deeper than"});
  }
  // A long value is quoted as a summary, not dumped whole into the message.
  std::string shape = "[";
  for (int i = 0; i < 20000; ++i) shape += (i ? ",-1" : "-1");
  shape += "]";
  std::string path = write_raw("long-shape", raw_file("{\"w\": {\"dtype\": \"U8\", \"shape\": " + shape + ", \"data_offsets\": [0, 0]}}", 0));
  try {
    SafetensorsFile f(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
    EXPECT_LT(std::string(e.what()).size(), path.size() + 200);
  }
}

TEST(Safetensors, IndexNamingAShardOutsideTheCheckpointIsRefused) {
  for (const char* shard : {"../model.safetensors", "/etc/passwd", "sub/../../x.safetensors"}) {
    SCOPED_TRACE(shard);
    std::string dir = scratch_dir("escape");
    std::ofstream(dir + "/model.safetensors.index.json") << json{{"weight_map", {{"w", shard}}}}.dump();
    expect_error([&] { TensorStore::open(dir); }, {dir + "/model.safetensors.index.json", "weight_map['w']", "inside"});
  }
  std::string dir = scratch_dir("index-deep");
  std::ofstream(dir + "/model.safetensors.index.json") << "{\"weight_map\": " << std::string(300000, '[') << "}";
  expect_error([&] { TensorStore::open(dir); }, {dir + "/model.safetensors.index.json", "deeper than"});
}

TEST(Safetensors, MissingTensorNamesWhere) {
  std::string path = scratch_dir("get") + "/m.safetensors";
  float v[2] = {1.f, 2.f};
  write_safetensors(path, {make_f32_tensor("present", {2}, v)});
  TensorStore s = TensorStore::open(path);
  EXPECT_TRUE(s.has("present"));
  EXPECT_FALSE(s.has("absent"));
  expect_error([&] { s.get("absent"); }, {path, "missing tensor", "'absent'"});
}

TEST(Safetensors, ExpectChecksDtypeAndShape) {
  std::string path = scratch_dir("expect") + "/m.safetensors";
  std::vector<float> v(6, 0.f);
  write_safetensors(path, {make_f32_tensor("w", {2, 3}, v.data())});
  TensorStore s = TensorStore::open(path);
  const TensorView& w = s.get("w");
  EXPECT_NO_THROW(w.expect(DType::F32, {2, 3}));
  EXPECT_NO_THROW(w.expect(DType::F32, {-1, 3}));
  expect_error([&] { w.expect(DType::BF16, {2, 3}); }, {path, "'w'", "dtype F32", "expected BF16"});
  expect_error([&] { w.expect(DType::F32, {3, 2}); }, {path, "'w'", "shape [2, 3]", "expected [3, 2]"});
  expect_error([&] { w.expect(DType::F32, {6}); }, {path, "'w'", "expected [6]"});
  expect_error([&] { w.expect(DType::F32, {-1, 2}); }, {path, "'w'", "expected [*, 2]"});
}

TEST(Safetensors, DirectoryWithoutCheckpoint) {
  std::string dir = scratch_dir("nockpt");
  expect_error([&] { TensorStore::open(dir); }, {dir, "model.safetensors"});
}

// ---- round trips ----

TEST(Safetensors, EveryDtypeRoundTrips) {
  std::string path = scratch_dir("dtypes") + "/all.safetensors";
  const std::vector<uint16_t> bf = {0x3fc0, 0xbf80, 0x0000, 0x7f80};     // 1.5, -1, 0, +inf
  const std::vector<uint16_t> h = {0x3c00, 0x0001, 0x03ff, 0x8001, 0x7bff, 0xc000};  // 1, 2^-24, 1023*2^-24, -2^-24, 65504, -2
  const std::vector<float> f = {0.25f, -3.5f, 1e-30f, 7.f};
  const std::vector<int8_t> i8 = {-128, 127, 0};
  const std::vector<int16_t> i16 = {-32768, 32767, 5, -5};
  const std::vector<int32_t> i32 = {std::numeric_limits<int32_t>::min(), 42};
  const std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::min(), 1, std::numeric_limits<int64_t>::max()};
  const std::vector<uint8_t> u8 = {0, 255, 9, 10};
  const std::vector<uint32_t> u32 = {0xffffffffu, 3};
  write_safetensors(path, {make_tensor("bf16", DType::BF16, {2, 2}, bf), make_tensor("f16", DType::F16, {3, 2}, h),
                           make_tensor("f32", DType::F32, {4}, f), make_tensor("i8", DType::I8, {3}, i8),
                           make_tensor("i16", DType::I16, {2, 2}, i16), make_tensor("i32", DType::I32, {2}, i32),
                           make_tensor("i64", DType::I64, {3}, i64), make_tensor("u8", DType::U8, {4, 1}, u8),
                           make_tensor("u32", DType::U32, {2}, u32), make_tensor("empty", DType::F32, {0, 4}, std::vector<float>{}),
                           make_tensor("scalar", DType::I32, {}, std::vector<int32_t>{-7})});
  SafetensorsFile file(path);
  EXPECT_EQ(file.tensors().size(), 11u);
  TensorStore s = TensorStore::open(path);

  auto check = [&](const char* name, DType dt, std::vector<int64_t> shape, const auto& want) {
    SCOPED_TRACE(name);
    const TensorView& t = s.get(name);
    EXPECT_EQ(t.name, name);
    EXPECT_EQ(t.file, path);
    EXPECT_EQ(t.dtype, dt);
    EXPECT_EQ(t.shape, shape);
    using T = typename std::decay_t<decltype(want)>::value_type;
    ASSERT_EQ(t.nbytes, want.size() * sizeof(T));
    ASSERT_EQ(size_t(t.numel()), want.size());
    EXPECT_EQ(std::vector<T>(t.as<T>(), t.as<T>() + want.size()), want);
  };
  check("bf16", DType::BF16, {2, 2}, bf);
  check("f16", DType::F16, {3, 2}, h);
  check("f32", DType::F32, {4}, f);
  check("i8", DType::I8, {3}, i8);
  check("i16", DType::I16, {2, 2}, i16);
  check("i32", DType::I32, {2}, i32);
  check("i64", DType::I64, {3}, i64);
  check("u8", DType::U8, {4, 1}, u8);
  check("u32", DType::U32, {2}, u32);
  check("empty", DType::F32, {0, 4}, std::vector<float>{});
  check("scalar", DType::I32, {}, std::vector<int32_t>{-7});

  EXPECT_EQ(s.get("bf16").to_f32(), (std::vector<float>{1.5f, -1.f, 0.f, INFINITY}));
  EXPECT_EQ(s.get("f16").to_f32(), (std::vector<float>{1.f, std::ldexp(1.f, -24), std::ldexp(1023.f, -24),
                                                       -std::ldexp(1.f, -24), 65504.f, -2.f}));
  EXPECT_EQ(s.get("f32").to_f32(), f);
  EXPECT_TRUE(s.get("empty").to_f32().empty());
  expect_error([&] { s.get("i32").to_f32(); }, {path, "'i32'", "I32", "floating-point"});
}

TEST(Safetensors, DtypeNamesAndSizes) {
  const std::pair<const char*, size_t> want[] = {{"BF16", 2}, {"F16", 2}, {"F32", 4}, {"I8", 1},  {"I16", 2},
                                                 {"I32", 4},  {"I64", 8}, {"U8", 1},  {"U32", 4}};
  for (auto [name, size] : want) {
    DType t;
    ASSERT_TRUE(parse_dtype(name, &t)) << name;
    EXPECT_STREQ(dtype_name(t), name);
    EXPECT_EQ(dtype_size(t), size) << name;
  }
  DType t;
  EXPECT_FALSE(parse_dtype("bf16", &t));  // the format's names are upper case
  EXPECT_FALSE(parse_dtype("F64", &t));
}

TEST(Safetensors, MetadataIsRead) {
  std::string path = write_raw("meta", raw_file(R"({"__metadata__": {"format": "pt", "n": 3},
                                                    "w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})",
                                                2));
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().count("n"), 0u);  // only string values are metadata
  EXPECT_EQ(f.tensors().size(), 1u);
}

// ---- sharded checkpoints ----

TensorData copy_tensor(const TensorView& t) {
  TensorData d{t.name, t.dtype, t.shape, std::vector<uint8_t>(t.nbytes)};
  std::memcpy(d.bytes.data(), t.data, t.nbytes);
  return d;
}

// Splits `src`'s model.safetensors into `n` shards with an index in a fresh directory; returns it.
// `extra` entries of the weight map are added as given (to name shards that do not exist).
std::string make_sharded(const std::string& src, int n, const json& extra = json::object()) {
  std::string dir = scratch_dir("sharded");
  fs::copy_file(src + "/config.json", dir + "/config.json");
  TensorStore whole = TensorStore::open(src + "/model.safetensors");
  std::vector<std::string> names = whole.names();
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  for (int k = 0; k < n; ++k) {
    std::string shard = fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, n);
    std::vector<TensorData> part;
    for (size_t i = size_t(k); i < names.size(); i += size_t(n)) {  // interleaved, so every shard mixes layers
      part.push_back(copy_tensor(whole.get(names[i])));
      index["weight_map"][names[i]] = shard;
    }
    write_safetensors(dir + "/" + shard, part);
  }
  for (auto& [k, v] : extra.items()) index["weight_map"][k] = v;
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);
  return dir;
}

TEST(Safetensors, ShardedCheckpointGivesBitIdenticalLogits) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", src);
  std::string dir = make_sharded(src, 3);
  ASSERT_FALSE(fs::exists(dir + "/model.safetensors"));

  TensorStore sharded = TensorStore::open(dir);
  TensorStore whole = TensorStore::open(src);
  EXPECT_EQ(sharded.names(), whole.names());
  EXPECT_EQ(fs::path(sharded.get(whole.names()[0]).file).parent_path(), fs::path(dir));

  auto a = load_model(src), b = load_model(dir);
  const std::vector<int> ids = {1, 17, 300, 5, 999, 42, 7};
  State sa = a->new_state(), sb = b->new_state();
  ForwardResult ra = a->forward(ids.data(), int(ids.size()), sa, {.all_logits = true});
  ForwardResult rb = b->forward(ids.data(), int(ids.size()), sb, {.all_logits = true});
  ASSERT_EQ(ra.logits.size(), ids.size() * size_t(a->config().vocab));
  ASSERT_EQ(ra.logits.size(), rb.logits.size());
  EXPECT_EQ(std::memcmp(ra.logits.data(), rb.logits.data(), ra.logits.size() * sizeof(float)), 0)
      << "sharded logits differ from the single-file ones";
}

TEST(Safetensors, MissingShardIsNamed) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", src);
  std::string dir = make_sharded(src, 3, {{"extra.weight", "model-00004-of-00003.safetensors"}});
  expect_error([&] { TensorStore::open(dir); },
               {dir + "/model.safetensors.index.json", "model-00004-of-00003.safetensors", "missing"});
}

TEST(Safetensors, TensorInTwoShardsIsAnError) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", src);
  std::string dir = make_sharded(src, 3);
  // Shard 2 also carries a tensor that shard 1 holds.
  const std::string s1 = dir + "/model-00001-of-00003.safetensors", s2 = dir + "/model-00002-of-00003.safetensors";
  SafetensorsFile first(s1);
  const TensorView& dup = first.tensors().begin()->second;
  std::vector<TensorData> part;
  {
    SafetensorsFile second(s2);
    for (auto& [name, t] : second.tensors()) part.push_back(copy_tensor(t));
  }
  part.push_back(copy_tensor(dup));
  write_safetensors(s2, part);
  expect_error([&] { TensorStore::open(dir); }, {dir, "'" + dup.name + "'", "two shards", s1, s2});
}

TEST(Safetensors, MalformedIndex) {
  std::string dir = scratch_dir("badindex");
  std::ofstream(dir + "/model.safetensors.index.json") << "{\"weight_map\": ";
  expect_error([&] { TensorStore::open(dir); }, {dir + "/model.safetensors.index.json", "malformed JSON"});
  std::ofstream(dir + "/model.safetensors.index.json") << R"({"metadata": {}})";
  expect_error([&] { TensorStore::open(dir); }, {dir + "/model.safetensors.index.json", "weight_map"});
  std::ofstream(dir + "/model.safetensors.index.json") << R"({"weight_map": {"w": 3}})";
  expect_error([&] { TensorStore::open(dir); }, {dir + "/model.safetensors.index.json", "weight_map['w']"});
}

}  // namespace
}  // namespace ms
