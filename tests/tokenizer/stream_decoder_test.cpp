// Streaming decode: only whole UTF-8 characters come out, and the pieces add up to decode().
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

// A tokenizer whose ids 0..255 are single bytes, so a test can split characters anywhere.
const ms::Tokenizer& bytes_tokenizer() {
  static const ms::Tokenizer tok = [] {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[ms::byte_level::map(std::string(1, char(b)))] = b;
    nlohmann::json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    nlohmann::json j = {{"pre_tokenizer", bl},
                        {"decoder", bl},
                        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
    std::string path = ms::test::scratch_dir("stream") + "/tokenizer.json";
    std::ofstream(path) << j.dump();
    return ms::Tokenizer::load(path);
  }();
  return tok;
}

std::vector<std::string> push_all(ms::StreamDecoder& d, const std::string& bytes) {
  std::vector<std::string> out;
  for (unsigned char b : bytes) out.push_back(d.push(b));
  return out;
}

TEST(StreamDecoder, HoldsSplitMultiByteCharacters) {
  ms::StreamDecoder d(bytes_tokenizer());
  EXPECT_EQ(push_all(d, "a\xC3\xA9z"), (std::vector<std::string>{"a", "", "\xC3\xA9", "z"}));
  EXPECT_EQ(d.flush(), "");
}

TEST(StreamDecoder, EmojiComesOutWhole) {
  ms::StreamDecoder d(bytes_tokenizer());
  const std::string thumbs = "\xF0\x9F\x91\x8D";  // U+1F44D
  EXPECT_EQ(push_all(d, thumbs), (std::vector<std::string>{"", "", "", thumbs}));
}

TEST(StreamDecoder, FlushReplacesAnIncompleteCharacter) {
  ms::StreamDecoder d(bytes_tokenizer());
  EXPECT_EQ(d.push(0xE2), "");
  EXPECT_EQ(d.push(0x82), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push('x'), "x");  // starts afresh
}

TEST(StreamDecoder, InvalidBytesBecomeReplacementAtOnce) {
  ms::StreamDecoder d(bytes_tokenizer());
  EXPECT_EQ(d.push(0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(0xC3), "");
  EXPECT_EQ(d.push('a'), "\xEF\xBF\xBD" "a");  // C3 can no longer complete
}

TEST(StreamDecoder, PiecesAddUpToDecode) {
  const ms::Tokenizer& t = bytes_tokenizer();
  const std::string text = "h\xC3\xA9llo \xE2\x88\x91 \xF0\x9F\x98\x80\xF0\x9F\x87\xAB\xF0\x9F\x87\xB7\xFF\xE2\x82";
  std::vector<int> ids;
  for (unsigned char b : text) ids.push_back(b);
  ms::StreamDecoder d(t);
  std::string streamed;
  for (int id : ids) {
    std::string piece = d.push(id);
    EXPECT_EQ(ms::utf8::first_invalid(piece), std::string::npos);
    streamed += piece;
  }
  streamed += d.flush();
  EXPECT_EQ(streamed, t.decode(ids));
}

TEST(StreamDecoder, Qwen3EmojiAcrossTokens) {
  MS_REQUIRE_SHARED("tokenizers/qwen3/tokenizer.json", path);
  ms::Tokenizer t = ms::Tokenizer::load(path);
  const std::string text = "flags \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7 ok \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD";
  std::vector<int> ids = t.encode(text);
  ms::StreamDecoder d(t);
  std::string streamed;
  int held = 0;
  for (int id : ids) {
    std::string piece = d.push(id);
    EXPECT_EQ(ms::utf8::first_invalid(piece), std::string::npos);
    if (piece.empty()) ++held;
    streamed += piece;
  }
  EXPECT_GT(held, 0);  // some emoji are split across byte tokens
  EXPECT_EQ(streamed + d.flush(), text);
}

TEST(Utf8, LossyReplacesMaximalSubparts) {
  auto lossy = [](const std::string& s) {
    std::string out;
    ms::utf8::append_lossy(out, s, true);
    return out;
  };
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(lossy("\xF0\x80\x80"), R + R + R);  // F0 needs 90..BF next
  EXPECT_EQ(lossy("\xF0\x9F\x98"), R);          // one truncated character
  EXPECT_EQ(lossy("\xED\xA0\x80"), R + R + R);  // surrogate
  EXPECT_EQ(lossy("\xC0\xAF"), R + R);          // overlong
  EXPECT_EQ(lossy("a\xE2\x82" "b"), "a" + R + "b");
}

}  // namespace
