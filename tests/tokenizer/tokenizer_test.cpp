// The tokenizer on small hand-made tokenizer.json files (merge order, added-token flags,
// normalisation, errors) and on Qwen3's real one (lookups).
#include "tokenizer/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "test_support.h"
#include "tokenizer/byte_level.h"
#include "util/error.h"

namespace {

using nlohmann::json;

// A byte-level BPE whose ids 0..255 are the single bytes (in byte order), then `extra`
// tokens (raw bytes, spelled through the byte-level alphabet) from 256 on.
json tiny_tokenizer(const std::vector<std::string>& extra, const json& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ms::byte_level::map(std::string(1, char(b)))] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[ms::byte_level::map(extra[i])] = 256 + int(i);
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", R"( ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

std::string write_json(const json& j) {
  std::string path = ms::test::scratch_dir("tok") + "/tokenizer.json";
  std::ofstream(path) << j.dump();
  return path;
}

std::string write_text(const std::string& text) {
  std::string path = ms::test::scratch_dir("tok") + "/tokenizer.json";
  std::ofstream(path) << text;
  return path;
}

ms::Tokenizer load(const json& j) { return ms::Tokenizer::load(write_json(j)); }

// Spellings of byte-level tokens, for writing merges readably.
std::string sp(const std::string& bytes) { return ms::byte_level::map(bytes); }

std::vector<int> bytes_of(const std::string& s) {
  std::vector<int> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

TEST(Tokenizer, MergesInBothSpellingsGiveTheSameResult) {
  std::vector<std::string> extra = {"he", "ll", "hell", "hello", " w", " wo"};
  json as_strings = {"h e", "l l", "he ll", "hell o", sp(" ") + " w", sp(" w") + " o"};
  json as_pairs = json::array();
  for (const auto& m : as_strings) {
    std::string s = m.get<std::string>();
    size_t space = s.find(' ');
    as_pairs.push_back({s.substr(0, space), s.substr(space + 1)});
  }
  ms::Tokenizer a = load(tiny_tokenizer(extra, as_strings));
  ms::Tokenizer b = load(tiny_tokenizer(extra, as_pairs));
  std::vector<int> want = {259, 261, 'r', 'l', 'd'};  // hello, " wo", r, l, d
  EXPECT_EQ(a.encode("hello world"), want);
  EXPECT_EQ(b.encode("hello world"), want);
  EXPECT_EQ(a.decode(want), "hello world");
}

TEST(Tokenizer, LowerRankMergesFirst) {
  std::vector<std::string> extra = {"ab", "bc"};
  EXPECT_EQ(load(tiny_tokenizer(extra, {"a b", "b c"})).encode("abc"), (std::vector<int>{256, 'c'}));
  EXPECT_EQ(load(tiny_tokenizer(extra, {"b c", "a b"})).encode("abc"), (std::vector<int>{'a', 257}));
}

TEST(Tokenizer, EqualRanksMergeLeftmostFirst) {
  ms::Tokenizer t = load(tiny_tokenizer({"aa"}, {"a a"}));
  EXPECT_EQ(t.encode("aaa"), (std::vector<int>{256, 'a'}));
  EXPECT_EQ(t.encode("aaaa"), (std::vector<int>{256, 256}));
}

TEST(Tokenizer, LongWordsAndRepeatsAreStable) {
  ms::Tokenizer t = load(tiny_tokenizer({"aa", "aaaa"}, {"a a", "aa aa"}));
  std::string word(1001, 'a');
  std::vector<int> want(250, 257);
  want.push_back('a');
  EXPECT_EQ(t.encode(word), want);
  EXPECT_EQ(t.encode(word), want);  // second time from the cache
  EXPECT_EQ(t.encode("aaaa aaaa"), (std::vector<int>{257, ' ', 257}));
}

TEST(Tokenizer, ConcurrentEncodesAgreeWithSerial) {
  ms::Tokenizer t = load(tiny_tokenizer({"ab", "abab", " ab"}, {"a b", "ab ab", sp(" ") + " ab"}));
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "abab ab a" + std::string(size_t(i % 7), 'b') + "\n";
  std::vector<int> serial = t.encode(text);
  std::vector<std::vector<int>> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) threads.emplace_back([&] { r = t.encode(text); });
  for (auto& th : threads) th.join();
  for (const auto& r : results) EXPECT_EQ(r, serial);
}

TEST(Tokenizer, BytesOutsideAsciiRoundTrip) {
  ms::Tokenizer t = load(tiny_tokenizer({}, json::array()));
  std::string text = "naïve ∑ 😀\t\r\n\x01";
  EXPECT_EQ(t.encode(text), bytes_of(text));
  EXPECT_EQ(t.decode(bytes_of(text)), text);
}

TEST(Tokenizer, NfcNormalisesBeforeSplitting) {
  ms::Tokenizer t = load(tiny_tokenizer({}, json::array()));
  EXPECT_EQ(t.encode("e\xCC\x81"), bytes_of("\xC3\xA9"));  // e + combining acute -> é
  // Several stretches that change, between text that does not: e+acute, Hangul jamo L+V,
  // the Angstrom sign, A+ring.
  EXPECT_EQ(t.encode("x e\xCC\x81 y \xE1\x84\x80\xE1\x85\xA1z\xE2\x84\xAB A\xCC\x8A."),
            bytes_of("x \xC3\xA9 y \xEA\xB0\x80z\xC3\x85 \xC3\x85."));
}

TEST(Tokenizer, SplitPatternComesFromTheFile) {
  json j = tiny_tokenizer({"ab"}, {"a b"});
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "a";  // "ab" never stays whole
  EXPECT_EQ(load(j).encode("ab"), (std::vector<int>{'a', 'b'}));
}

TEST(Tokenizer, WhiteSpaceIsUnicodeWhiteSpace) {
  // U+180E is not White_Space, so it does not split "a\u180Eb" under Oniguruma (which HF uses),
  // although PCRE2's own \s takes it. The merge "a"+"\xE1" shows whether the word stayed whole.
  const std::string text = "a\xE1\xA0\x8E" "b";
  for (const char* pattern : {R"(\s+|\S+)", R"(\s+|[^\s]+)"}) {
    json j = tiny_tokenizer({"a\xE1"}, {sp("a") + " " + sp("\xE1")});
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern;
    EXPECT_EQ(load(j).encode(text), (std::vector<int>{256, 0xA0, 0x8E, 'b'})) << pattern;
  }
}

json with_added(json j, json token) {
  token["id"] = 300;
  for (const char* k : {"single_word", "lstrip", "rstrip", "normalized"})
    if (!token.contains(k)) token[k] = false;
  if (!token.contains("special")) token["special"] = true;
  j["added_tokens"].push_back(token);
  return j;
}

TEST(Tokenizer, AddedTokensAreMatchedBeforeSplitting) {
  ms::Tokenizer t = load(with_added(tiny_tokenizer({"ab"}, {"a b"}), {{"content", "<|x|>"}}));
  EXPECT_EQ(t.encode("a<|x|>b"), (std::vector<int>{'a', 300, 'b'}));
  EXPECT_EQ(t.encode("<|x|><|x|>ab"), (std::vector<int>{300, 300, 256}));
  EXPECT_EQ(t.encode("<|x"), bytes_of("<|x"));
  EXPECT_EQ(t.decode({'a', 300, 'b'}), "a<|x|>b");
  EXPECT_EQ(t.token_id("<|x|>"), 300);
  EXPECT_TRUE(t.is_special(300));
  EXPECT_FALSE(t.is_special('a'));
}

TEST(Tokenizer, LongestAddedTokenWins) {
  json j = with_added(tiny_tokenizer({}, json::array()), {{"content", "<a>"}});
  j["added_tokens"].push_back({{"id", 301}, {"content", "<a>>"}, {"special", true}});
  EXPECT_EQ(load(j).encode("<a>>"), (std::vector<int>{301}));
}

TEST(Tokenizer, AddedTokenStripFlagsTakeWhiteSpace) {
  json j = with_added(tiny_tokenizer({}, json::array()),
                      {{"content", "<m>"}, {"lstrip", true}, {"rstrip", true}});
  EXPECT_EQ(load(j).encode("a \t<m>  b"), (std::vector<int>{'a', 300, 'b'}));
}

TEST(Tokenizer, SingleWordAddedTokenNeedsWordBoundaries) {
  json j = with_added(tiny_tokenizer({}, json::array()), {{"content", "cat"}, {"single_word", true}});
  ms::Tokenizer t = load(j);
  EXPECT_EQ(t.encode("a cat."), (std::vector<int>{'a', ' ', 300, '.'}));
  EXPECT_EQ(t.encode("cats"), bytes_of("cats"));
}

TEST(Tokenizer, NormalizedAddedTokenMatchesNormalisedText) {
  json j = with_added(tiny_tokenizer({}, json::array()),
                      {{"content", "\xC3\xA9"}, {"normalized", true}, {"special", false}});
  EXPECT_EQ(load(j).encode("xe\xCC\x81"), (std::vector<int>{'x', 300}));
}

// Text marked untrusted (a chat request's) is read as text: no added or special token
// matches where any of its bytes is untrusted; the rest of the text is read as before.
TEST(Tokenizer, UntrustedRangesReadAddedTokensAsText) {
  ms::Tokenizer t = load(with_added(tiny_tokenizer({"ab"}, {"a b"}), {{"content", "<x>"}}));
  using ms::MarkedText;
  EXPECT_EQ(t.encode(MarkedText{"<x>a<x>", {}}), t.encode("<x>a<x>"));
  EXPECT_EQ(t.encode("<x>a<x>"), (std::vector<int>{300, 'a', 300}));
  EXPECT_EQ(t.encode(MarkedText{"<x>a<x>", {{3, 7}}}), (std::vector<int>{300, 'a', '<', 'x', '>'}));
  EXPECT_EQ(t.encode(MarkedText{"<x>a<x>", {{2, 4}}}), (std::vector<int>{'<', 'x', '>', 'a', 300}));  // one byte is enough
  EXPECT_EQ(t.encode(MarkedText{"<x><x>", {{0, 3}}}), (std::vector<int>{'<', 'x', '>', 300}));
  EXPECT_EQ(t.encode(MarkedText{"ab<x>ab", {{0, 7}}}), (std::vector<int>{256, '<', 'x', '>', 256}));
  EXPECT_THROW(t.encode(MarkedText{"ab", {{1, 5}}}), ms::Error);
  EXPECT_THROW(t.encode(MarkedText{"abcd", {{2, 3}, {0, 1}}}), ms::Error);
  EXPECT_THROW(t.encode(MarkedText{"ab", {{1, 1}}}), ms::Error);

  // Tokens matched after normalisation too: the untrusted "e + combining acute" stays text.
  json j = with_added(tiny_tokenizer({}, json::array()), {{"content", "\xC3\xA9"}, {"normalized", true}, {"special", false}});
  ms::Tokenizer n = load(j);
  EXPECT_EQ(n.encode(MarkedText{"xe\xCC\x81", {}}), (std::vector<int>{'x', 300}));
  EXPECT_EQ(n.encode(MarkedText{"xe\xCC\x81", {{1, 4}}}), (std::vector<int>{'x', 0xC3, 0xA9}));
  EXPECT_EQ(n.encode(MarkedText{"e\xCC\x81xe\xCC\x81", {{0, 3}}}), (std::vector<int>{0xC3, 0xA9, 'x', 300}));
}

TEST(Tokenizer, GptStyleByteLevelSplitsAndAddsPrefixSpace) {
  json j = tiny_tokenizer({" a", " ab"}, {sp(" ") + " a", sp(" a") + " b"});
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(load(j).encode("ab ab"), (std::vector<int>{257, 257}));
}

TEST(Tokenizer, IgnoreMergesTakesWholeWordTokens) {
  json j = tiny_tokenizer({"abc"}, json::array());
  EXPECT_EQ(load(j).encode("abc"), bytes_of("abc"));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(load(j).encode("abc"), (std::vector<int>{256}));
}

TEST(Tokenizer, DecodeSkipsIdsWithoutTokensAndReplacesBrokenUtf8) {
  ms::Tokenizer t = load(tiny_tokenizer({}, json::array()));
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_EQ(t.decode({'o', 99999, -1, 'k'}), "ok");
  EXPECT_EQ(t.decode({0xE2, 0x82}), "\xEF\xBF\xBD");         // truncated: one U+FFFD
  EXPECT_EQ(t.decode({0xFF, 'a'}), "\xEF\xBF\xBD" "a");      // invalid byte
  EXPECT_EQ(t.token_text(0xC3), "\xC3");
  EXPECT_EQ(t.token_text(99999), "");
}

TEST(Tokenizer, RejectsInvalidUtf8Input) {
  ms::Tokenizer t = load(tiny_tokenizer({}, json::array()));
  EXPECT_THROW(t.encode("ab\xC3"), ms::Error);
}

void expect_load_error(const std::string& path, const std::string& fragment) {
  try {
    ms::Tokenizer::load(path);
    ADD_FAILURE() << "loaded without error; expected one mentioning " << fragment;
  } catch (const ms::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << "error does not name the file: " << msg;
  }
}

TEST(TokenizerErrors, MissingFileOrBadJson) {
  expect_load_error(ms::test::scratch_dir("tok") + "/absent.json", "cannot open");
  expect_load_error(write_text("{\"model\": "), "malformed JSON");
}

TEST(TokenizerErrors, DeepNestingIsAnErrorNotACrash) {
  for (size_t depth : {300, 300000}) expect_load_error(write_text("{\"model\": " + std::string(depth, '[')), "deeper than");
  expect_load_error(write_text("{\"added_tokens\": [" + std::string(300000, '{') + "]}"), "malformed JSON");
}

TEST(TokenizerErrors, UnsupportedParts) {
  json base = tiny_tokenizer({"ab"}, {"a b"});
  json j = base;
  j["model"]["type"] = "Unigram";
  expect_load_error(write_json(j), "model.type is 'Unigram'");
  j = base;
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_load_error(write_json(j), "pre_tokenizer.type is 'Metaspace'");
  j = base;
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  expect_load_error(write_json(j), "pre_tokenizer.pretokenizers[0].behavior is 'Removed'");
  j = base;
  j["pre_tokenizer"]["pretokenizers"].erase(1);
  expect_load_error(write_json(j), "no ByteLevel step");
  j = base;
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_load_error(write_json(j), "normalizer.type is 'Lowercase'");
  j = base;
  j["post_processor"] = {{"type", "TemplateProcessing"}};
  expect_load_error(write_json(j), "post_processor.type is 'TemplateProcessing'");
  j = base;
  j["decoder"] = {{"type", "WordPiece"}};
  expect_load_error(write_json(j), "decoder");
  j = base;
  j["model"]["byte_fallback"] = true;
  expect_load_error(write_json(j), "model.byte_fallback");
}

TEST(TokenizerErrors, MalformedFields) {
  json base = tiny_tokenizer({"ab"}, {"a b"});
  json j = base;
  j["model"]["merges"] = {"a zz"};
  expect_load_error(write_json(j), "model.merges[0]: token 'zz' is not in model.vocab");
  j["model"]["merges"] = {"abc"};
  expect_load_error(write_json(j), "model.merges[0] is 'abc'");
  j["model"]["merges"] = {{"a"}};
  expect_load_error(write_json(j), "model.merges[0] is neither");
  j = base;
  j["model"].erase("vocab");
  expect_load_error(write_json(j), "model.vocab is missing");
  j = base;
  j["model"]["vocab"]["a"] = "one";
  expect_load_error(write_json(j), "model.vocab[\"a\"]");
  j = base;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_load_error(write_json(j), "pre_tokenizer.pretokenizers[0].pattern.Regex: cannot compile");
  j = base;
  j["added_tokens"] = {{{"content", "<x>"}}};
  expect_load_error(write_json(j), "added_tokens[0].id is missing");
}

// Every id and list in tokenizer.json is checked before it sizes a table or names a token.
TEST(TokenizerErrors, IdsOutOfRangeOrClashing) {
  const json base = tiny_tokenizer({"ab"}, {"a b"});
  auto with_vocab = [&](const char* spelling, json id) {
    json j = base;
    j["model"]["vocab"][spelling] = std::move(id);
    return write_json(j);
  };
  expect_load_error(with_vocab("zz", -1), "model.vocab[\"zz\"] is -1, not a non-negative integer id");
  expect_load_error(with_vocab("zz", 2.5), "model.vocab[\"zz\"] is 2.5, not a non-negative integer id");
  expect_load_error(with_vocab("zz", "7"), "model.vocab[\"zz\"] is string, not a non-negative integer id");
  expect_load_error(with_vocab("zz", 4294967296LL), "model.vocab[\"zz\"] is 4294967296; ids above 4194303 are not supported");
  expect_load_error(with_vocab("zz", 18446744073709551615ULL), "ids above 4194303 are not supported");
  expect_load_error(with_vocab("zz", 5), "model.vocab: tokens ");  // 5 is a byte's id
  expect_load_error(with_vocab("zz", 5), "both have id 5");

  auto with_added_tokens = [&](json tokens) {
    json j = base;
    j["added_tokens"] = std::move(tokens);
    return write_json(j);
  };
  expect_load_error(with_added_tokens({{{"id", 9999999999LL}, {"content", "<x>"}}}),
                    "added_tokens[0].id is 9999999999; ids above 4194303 are not supported");
  expect_load_error(with_added_tokens({{{"id", -3}, {"content", "<x>"}}}), "added_tokens[0].id is -3, not a non-negative");
  expect_load_error(with_added_tokens({{{"id", 300}, {"content", "<x>"}}, {{"id", 300}, {"content", "<y>"}}}),
                    "added_tokens[1]: id 300 is both '<x>' and '<y>'");
  expect_load_error(with_added_tokens({{{"id", 300}, {"content", "<x>"}}, {{"id", 301}, {"content", "<x>"}}}),
                    "added_tokens[1]: '<x>' is both id 300 and id 301");
  expect_load_error(with_added_tokens({{{"id", 'a'}, {"content", "<x>"}}}),
                    "added_tokens[0]: id 97 is already model.vocab's token 'a', not '<x>'");
  expect_load_error(with_added_tokens({{{"id", 300}, {"content", 5}}}), "added_tokens[0].content is not a string");
  expect_load_error(with_added_tokens({{{"id", 300}, {"content", "<x>"}, {"special", "yes"}}}),
                    "added_tokens[0].special is not true or false");
  expect_load_error(with_added_tokens(json::array({300})), "added_tokens[0] is not an object");
  expect_load_error(with_added_tokens(json::object()), "added_tokens is not an array");
  // The same token in the vocabulary and the added list, as GPT-2's <|endoftext|> is, loads.
  ms::Tokenizer t = ms::Tokenizer::load(with_added_tokens({{{"id", 'a'}, {"content", "a"}, {"special", true}}}));
  EXPECT_TRUE(t.is_special('a'));

  json j = base;
  j["model"]["vocab"] = json::array({"a"});
  expect_load_error(write_json(j), "model.vocab is not an object");
  j = base;
  j["model"]["merges"] = "a b";
  expect_load_error(write_json(j), "model.merges is not an array");
  j = base;
  j["model"]["unk_token"] = "<unk>";
  expect_load_error(write_json(j), "model.unk_token '<unk>' is not in model.vocab");
  j = base;
  j["pre_tokenizer"]["pretokenizers"] = json::array({1});
  expect_load_error(write_json(j), "pre_tokenizer.pretokenizers[0] is not an object");
  j = base;
  j["decoder"] = "ByteLevel";
  expect_load_error(write_json(j), "decoder is not an object");
}

TEST(TokenizerQwen3, LooksUpTokensBothWays) {
  MS_REQUIRE_SHARED("tokenizers/qwen3/tokenizer.json", path);
  ms::Tokenizer t = ms::Tokenizer::load(path);
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.token_id("<|im_end|>"), 151645);
  EXPECT_EQ(t.token_text(151645), "<|im_end|>");
  EXPECT_TRUE(t.is_special(151645));
  EXPECT_FALSE(t.is_special(151667));  // <think> is added but not special
  EXPECT_EQ(t.token_id("\xC4\xA0world"), 1879);  // "Ġworld"
  EXPECT_EQ(t.token_text(1879), " world");
  EXPECT_EQ(t.token_id("no such token"), -1);
}

}  // namespace
