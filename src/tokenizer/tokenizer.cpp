#include "tokenizer/tokenizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"
#include "util/error.h"
#include "util/json.h"

namespace ms {

using json = nlohmann::json;

namespace {

enum class Kind : uint8_t { None, Model, Added, Special };

// The largest token id accepted: real vocabularies stay below 2^18; the bound keeps a file
// with one huge id from sizing the id tables to gigabytes.
constexpr long long kMaxTokenId = (1 << 22) - 1;

// An id field's value, checked: a non-negative integer within kMaxTokenId.
int token_id_of(const json& v, const std::string& where) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<long long>() < 0))
    fail("{} is {}, not a non-negative integer id", where, v.is_number() ? v.dump() : std::string(v.type_name()));
  if (v.is_number_unsigned() ? v.get<unsigned long long>() > (unsigned long long)kMaxTokenId : v.get<long long>() > kMaxTokenId)
    fail("{} is {}; ids above {} are not supported", where, v.dump(), kMaxTokenId);
  return v.get<int>();
}

json read_json(const std::string& path) {
  if (!std::ifstream(path, std::ios::binary)) fail("{}: cannot open tokenizer file", path);
  return parse_json_file(path);
}

// A JSON value and where it is, for error messages ("file: model.merges[3]").
struct Field {
  const json& value;
  std::string path;  // the file
  std::string name;  // the field

  std::string where() const { return path + ": " + name; }
  bool has(const char* key) const {
    return value.is_object() && value.contains(key) && !value[key].is_null();
  }
  Field operator[](const char* key) const {
    if (!value.is_object()) fail("{} is not an object", where());
    if (!value.contains(key)) fail("{}.{} is missing", where(), key);
    return {value[key], path, name + "." + key};
  }
  Field operator[](size_t i) const { return {value[i], path, name + "[" + std::to_string(i) + "]"}; }
  const std::string& str() const {
    if (!value.is_string()) fail("{} is not a string", where());
    return value.get_ref<const std::string&>();
  }
  const json::array_t& array() const {
    if (!value.is_array()) fail("{} is not an array", where());
    return value.get_ref<const json::array_t&>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = value[key];
    if (!v.is_boolean()) fail("{}.{} is not true or false", where(), key);
    return v.get<bool>();
  }
  std::string type() const { return (*this)["type"].str(); }
};

std::string nfc(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    utf8proc_ssize_t(s.size()), &out,
                                    utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) fail("NFC normalisation failed: {}", utf8proc_errmsg(n));
  std::string r(reinterpret_cast<const char*>(out), size_t(n));
  std::free(out);
  return r;
}

size_t char_length(std::string_view s, size_t i) {
  size_t j = i;
  utf8::next(s, j);
  return j - i;
}

// The first byte at or after `from` that starts a character >= U+0300 (lead byte >= 0xCC),
// or npos. Skips ASCII eight bytes at a time.
size_t find_nfc_candidate(std::string_view s, size_t from) {
  size_t i = from;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    if (v & 0x8080808080808080ull) break;
  }
  for (; i < s.size(); ++i)
    if (static_cast<unsigned char>(s[i]) >= 0xCC) return i;
  return std::string_view::npos;
}

// Characters below U+0300 are starters that nothing composes onto from before, so NFC can be
// applied to stretches between them separately: only the stretches of characters >= U+0300,
// each with the starter before it, are normalised. Returns the normalised text (held in
// `storage` when it differs from `s`).
std::string_view nfc_text(std::string_view s, std::string& storage) {
  size_t i = find_nfc_candidate(s, 0);
  if (i == std::string_view::npos) return s;
  storage.clear();
  storage.reserve(s.size() + s.size() / 8);
  size_t copied = 0;
  while (i != std::string_view::npos) {
    size_t starter = i;
    if (starter > copied)  // step back to the start of the character before
      do --starter;
      while (starter > copied && (static_cast<unsigned char>(s[starter]) & 0xC0) == 0x80);
    size_t end = i;
    while (end < s.size() && static_cast<unsigned char>(s[end]) >= 0xCC) end += char_length(s, end);
    storage.append(s, copied, starter - copied);
    storage += nfc(s.substr(starter, end - starter));
    copied = end;
    i = find_nfc_candidate(s, end);
  }
  storage.append(s, copied);
  return storage;
}

// Hugging Face's "Isolated" split: every match and every stretch between matches is a piece.
// Empty matches split nothing.
template <class F>
void for_each_isolated(const Regex& re, std::string_view s, F&& piece) {
  size_t done = 0, from = 0, b, e;
  while (from < s.size() && re.find(s, from, &b, &e)) {
    if (e == b) {
      if (b >= s.size()) break;
      from = b + char_length(s, b);
      continue;
    }
    if (b > done) piece(s.substr(done, b - done));
    piece(s.substr(b, e - b));
    done = from = e;
  }
  if (done < s.size()) piece(s.substr(done));
}

// GPT-2's split, which a ByteLevel pre-tokenizer with use_regex applies (fixed by the library,
// not stored in tokenizer.json).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

struct Tokenizer::Impl {
  std::string path;
  Bpe::WordMap spelling_to_id;  // added tokens override the model's
  std::vector<std::string> id_bytes;                    // what each id decodes to
  std::vector<Kind> id_kind;
  AddedTokenMatcher raw_added;         // matched in the text as given
  AddedTokenMatcher normalized_added;  // matched after normalisation
  bool nfc = false;
  std::vector<Regex> splits;  // the pre-tokenizer's Split steps, in order
  bool add_prefix_space = false;
  std::optional<Regex> byte_level_regex;
  std::unique_ptr<Bpe> bpe;

  void parse_model(const Field& model);
  void parse_normalizer(const Field& normalizer);
  void parse_pre_tokenizer(const Field& pre);
  void parse_added_tokens(const Field& added);

  void encode(std::string_view text, const std::vector<ByteRange>& untrusted, std::vector<int>& ids) const;
  void encode_segment(std::string_view text, const std::vector<ByteRange>& untrusted, std::vector<int>& ids) const;
  void pre_tokenize(std::string_view piece, size_t stage, std::vector<int>& ids) const;
  void encode_byte_level(std::string_view piece, std::vector<int>& ids) const;
};

void Tokenizer::Impl::parse_model(const Field& model) {
  if (model.has("type") && model.type() != "BPE")
    fail("{}: model.type is '{}'; only 'BPE' is supported", path, model.type());
  if (model.has("dropout") && (!model["dropout"].value.is_number() || model["dropout"].value.get<double>() != 0.0))
    fail("{}: model.dropout is set; BPE dropout is not supported", path);
  if (model.flag("byte_fallback", false))
    fail("{}: model.byte_fallback is true; only byte-level BPE is supported", path);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.has(key) && !model[key].str().empty())
      fail("{}: model.{} is '{}'; only an empty one is supported", path, key, model[key].str());

  Field vocab = model["vocab"];
  if (!vocab.value.is_object()) fail("{} is not an object", vocab.where());
  int max_id = -1;
  spelling_to_id.reserve(vocab.value.size());
  std::vector<const std::string*> spelling_of;  // by id, to name a duplicate
  for (const auto& [spelling, id_value] : vocab.value.items()) {
    int id = token_id_of(id_value, fmt::format("{}[\"{}\"]", vocab.where(), spelling));
    if (size_t(id) >= spelling_of.size()) spelling_of.resize(size_t(id) + 1, nullptr);
    if (spelling_of[size_t(id)])
      fail("{}: tokens '{}' and '{}' both have id {}", vocab.where(), *spelling_of[size_t(id)], spelling, id);
    spelling_of[size_t(id)] = &spelling;
    spelling_to_id[spelling] = id;
    max_id = std::max(max_id, id);
  }
  id_bytes.resize(size_t(max_id + 1));
  id_kind.assign(size_t(max_id + 1), Kind::None);

  Bpe::Options opt;
  opt.ignore_merges = model.flag("ignore_merges", false);
  for (const auto& [spelling, id] : spelling_to_id) {
    std::string bytes;
    bool mapped = byte_level::unmap(spelling, &bytes);
    id_bytes[size_t(id)] = mapped ? bytes : spelling;  // HF's decoder keeps such tokens as they are
    id_kind[size_t(id)] = Kind::Model;
    if (mapped && opt.ignore_merges) opt.word_ids.emplace(std::move(bytes), id);
  }
  // Errors name "file: model.merges[i]"; the name is only built for an error.
  auto lookup = [&](std::string_view spelling, const std::string& field, size_t i) {
    auto it = spelling_to_id.find(spelling);
    if (it == spelling_to_id.end())
      fail("{}: {}[{}]: token '{}' is not in model.vocab", path, field, i, spelling);
    return it->second;
  };
  for (int b = 0; b < 256; ++b) {
    std::string spelling;
    utf8::append(spelling, byte_level::byte_to_char()[size_t(b)]);
    auto it = spelling_to_id.find(spelling);
    opt.byte_ids[size_t(b)] = it == spelling_to_id.end() ? -1 : it->second;
  }

  Field merges = model["merges"];
  const json::array_t& list = merges.array();
  opt.merges.reserve(list.size());
  std::string joined;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    std::string_view left, right;
    if (m.is_string()) {  // "left right"
      std::string_view s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail("{}[{}] is '{}'; expected two tokens separated by one space", merges.where(), i, s);
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["left", "right"]
      left = m[0].get_ref<const std::string&>();
      right = m[1].get_ref<const std::string&>();
    } else {
      fail("{}[{}] is neither \"left right\" nor [\"left\", \"right\"]", merges.where(), i);
    }
    joined.assign(left);
    joined += right;
    opt.merges.push_back({lookup(left, "model.merges", i), lookup(right, "model.merges", i),
                          lookup(joined, "model.merges", i)});
  }

  if (model.has("unk_token")) {
    const std::string& unk = model["unk_token"].str();
    auto it = spelling_to_id.find(unk);
    if (it == spelling_to_id.end()) fail("{}: model.unk_token '{}' is not in model.vocab", path, unk);
    opt.unk_id = it->second;
  }
  opt.fuse_unk = model.flag("fuse_unk", false);
  bpe = std::make_unique<Bpe>(std::move(opt));
}

void Tokenizer::Impl::parse_normalizer(const Field& normalizer) {
  if (normalizer.value.is_null()) return;
  std::string type = normalizer.type();
  if (type == "NFC") {
    nfc = true;
  } else if (type == "Sequence") {
    Field list = normalizer["normalizers"];
    for (size_t i = 0; i < list.array().size(); ++i) parse_normalizer(list[i]);
  } else {
    fail("{}.type is '{}'; only NFC (alone or in a Sequence) is supported", normalizer.where(), type);
  }
}

void Tokenizer::Impl::parse_pre_tokenizer(const Field& pre) {
  if (pre.value.is_null())
    fail("{} is null; a byte-level BPE needs a ByteLevel pre-tokenizer", pre.where());
  std::vector<Field> steps;
  if (pre.type() == "Sequence") {
    Field list = pre["pretokenizers"];
    for (size_t i = 0; i < list.array().size(); ++i) steps.push_back(list[i]);
  } else {
    steps.push_back(pre);
  }
  bool byte_level_seen = false;
  for (const Field& step : steps) {
    std::string type = step.type();
    if (byte_level_seen)
      fail("{} ({}) follows the ByteLevel step; only Split steps before one ByteLevel are supported",
           step.where(), type);
    if (type == "Split") {
      Field pattern = step["pattern"];
      if (pattern.has("Regex"))
        splits.push_back(Regex::compile(pattern["Regex"].str(), pattern["Regex"].where()));
      else if (pattern.has("String"))
        splits.push_back(Regex::literal(pattern["String"].str(), pattern["String"].where()));
      else
        fail("{} has neither Regex nor String", pattern.where());
      if (step["behavior"].str() != "Isolated")
        fail("{}.behavior is '{}'; only 'Isolated' is supported", step.where(), step["behavior"].str());
      if (step.flag("invert", false)) fail("{}.invert is true; only false is supported", step.where());
    } else if (type == "ByteLevel") {
      byte_level_seen = true;
      add_prefix_space = step.flag("add_prefix_space", true);
      if (step.flag("use_regex", true))
        byte_level_regex = Regex::compile(kGpt2Pattern, step.where() + " (GPT-2 split)");
    } else {
      fail("{}.type is '{}'; only Split and ByteLevel are supported", step.where(), type);
    }
  }
  if (!byte_level_seen) fail("{} has no ByteLevel step; only byte-level BPE is supported", pre.where());
}

void Tokenizer::Impl::parse_added_tokens(const Field& added) {
  if (added.value.is_null()) return;
  std::unordered_map<int, std::string> content_of;  // the added tokens so far, by id
  for (size_t i = 0; i < added.array().size(); ++i) {
    Field f = added[i];
    AddedToken t;
    t.id = token_id_of(f["id"].value, f.where() + ".id");
    t.content = f["content"].str();
    if (auto [it, fresh] = content_of.emplace(t.id, t.content); !fresh && it->second != t.content)
      fail("{}: id {} is both '{}' and '{}'", f.where(), t.id, it->second, t.content);
    if (auto it = spelling_to_id.find(t.content); it != spelling_to_id.end() && it->second != t.id &&
                                                   content_of.count(it->second))
      fail("{}: '{}' is both id {} and id {}", f.where(), t.content, it->second, t.id);
    if (size_t(t.id) < id_kind.size() && id_kind[size_t(t.id)] == Kind::Model) {
      auto it = spelling_to_id.find(t.content);  // the same token in both lists is fine
      if (it == spelling_to_id.end() || it->second != t.id)
        fail("{}: id {} is already model.vocab's token '{}', not '{}'", f.where(), t.id,
             byte_level::map(id_bytes[size_t(t.id)]), t.content);
    }
    t.single_word = f.flag("single_word", false);
    t.lstrip = f.flag("lstrip", false);
    t.rstrip = f.flag("rstrip", false);
    t.normalized = f.flag("normalized", !f.flag("special", false));
    t.special = f.flag("special", false);
    if (t.content.empty()) continue;  // HF ignores these

    size_t id = size_t(t.id);
    if (id >= id_bytes.size()) {
      id_bytes.resize(id + 1);
      id_kind.resize(id + 1, Kind::None);
    }
    std::string bytes;
    id_bytes[id] = byte_level::unmap(t.content, &bytes) ? bytes : t.content;
    id_kind[id] = t.special ? Kind::Special : Kind::Added;
    spelling_to_id[t.content] = t.id;
    if (t.normalized) {
      if (nfc) t.content = ms::nfc(t.content);
      normalized_added.add(t);
    } else {
      raw_added.add(t);
    }
  }
}

Tokenizer Tokenizer::load(const std::string& path) {
  json doc = read_json(path);
  if (!doc.is_object()) fail("{}: expected a JSON object at the top level", path);
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  // Field names in errors read as "file: model.merges[3]".
  auto top = [&](const char* key) {
    if (!doc.contains(key)) fail("{}: {} is missing", path, key);
    return Field{doc[key], path, key};
  };
  impl->parse_model(top("model"));
  if (doc.contains("normalizer")) impl->parse_normalizer(top("normalizer"));
  impl->parse_pre_tokenizer(top("pre_tokenizer"));
  if (doc.contains("added_tokens")) impl->parse_added_tokens(top("added_tokens"));

  Field decoder = top("decoder");
  bool byte_level_decoder = !decoder.value.is_null() && decoder.type() == "ByteLevel";
  if (!byte_level_decoder)
    fail("{}: decoder is not ByteLevel; only byte-level decoding is supported", path);
  if (doc.contains("post_processor") && !doc["post_processor"].is_null() &&
      top("post_processor").type() != "ByteLevel")
    fail("{}: post_processor.type is '{}'; only ByteLevel (which adds no tokens) is supported", path,
         top("post_processor").type());
  // truncation and padding are for batched training inputs; the engine never applies them.
  return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::encode(std::string_view text, const std::vector<ByteRange>& untrusted,
                             std::vector<int>& ids) const {
  std::vector<AddedTokenMatcher::Piece> pieces;
  raw_added.split(text, pieces, untrusted);
  for (const auto& p : pieces) {
    if (p.id >= 0)
      ids.push_back(p.id);
    else
      encode_segment(text.substr(p.begin, p.end - p.begin),
                     untrusted.empty() ? untrusted : marks_within(untrusted, p.begin, p.end), ids);
  }
}

namespace {

// NFC of text whose `untrusted` ranges must stay known: each run of trusted or untrusted
// bytes is normalised on its own, and the marks move with the runs.
MarkedText nfc_runs(std::string_view text, const std::vector<ByteRange>& untrusted) {
  MarkedText out;
  std::string storage;
  size_t pos = 0;
  for (const ByteRange& r : untrusted) {
    if (r.begin > pos) out.append(nfc_text(text.substr(pos, r.begin - pos), storage), false);
    out.append(nfc_text(text.substr(r.begin, r.end - r.begin), storage), true);
    pos = r.end;
  }
  if (pos < text.size()) out.append(nfc_text(text.substr(pos), storage), false);
  return out;
}

}  // namespace

// Text between two raw added tokens: normalised, then split on the normalised added tokens.
void Tokenizer::Impl::encode_segment(std::string_view text, const std::vector<ByteRange>& untrusted,
                                     std::vector<int>& ids) const {
  std::string normalized;
  if (normalized_added.empty() || untrusted.empty()) {
    if (nfc) text = nfc_text(text, normalized);
  }
  if (normalized_added.empty()) {
    pre_tokenize(text, 0, ids);
    return;
  }
  MarkedText runs;
  if (!untrusted.empty()) {  // normalised added tokens must not match untrusted text either
    runs = nfc ? nfc_runs(text, untrusted) : MarkedText{std::string(text), untrusted};
    text = runs.text;
  }
  std::vector<AddedTokenMatcher::Piece> pieces;
  normalized_added.split(text, pieces, runs.untrusted);
  for (const auto& p : pieces) {
    if (p.id >= 0)
      ids.push_back(p.id);
    else
      pre_tokenize(text.substr(p.begin, p.end - p.begin), 0, ids);
  }
}

void Tokenizer::Impl::pre_tokenize(std::string_view piece, size_t stage, std::vector<int>& ids) const {
  if (stage == splits.size()) {
    encode_byte_level(piece, ids);
    return;
  }
  for_each_isolated(splits[stage], piece,
                    [&](std::string_view sub) { pre_tokenize(sub, stage + 1, ids); });
}

void Tokenizer::Impl::encode_byte_level(std::string_view piece, std::vector<int>& ids) const {
  std::string prefixed;
  if (add_prefix_space && piece[0] != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  if (!byte_level_regex) {
    bpe->encode_word(piece, ids);
    return;
  }
  for_each_isolated(*byte_level_regex, piece, [&](std::string_view word) { bpe->encode_word(word, ids); });
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int> Tokenizer::encode(std::string_view text) const {
  size_t bad = utf8::first_invalid(text);
  if (bad != std::string_view::npos)
    fail("tokenizer input is not valid UTF-8 (at byte {} of {})", bad, text.size());
  std::vector<int> ids;
  ids.reserve(text.size() / 3);
  impl_->encode(text, {}, ids);
  return ids;
}

std::vector<int> Tokenizer::encode(const MarkedText& text) const {
  size_t bad = utf8::first_invalid(text.text);
  if (bad != std::string_view::npos)
    fail("tokenizer input is not valid UTF-8 (at byte {} of {})", bad, text.text.size());
  size_t previous_end = 0;
  for (const ByteRange& r : text.untrusted) {
    if (r.begin >= r.end || r.end > text.text.size() || r.begin < previous_end)
      fail("tokenizer input: untrusted range [{}, {}) is empty, outside the {}-byte text or out of order", r.begin,
           r.end, text.text.size());
    previous_end = r.end;
  }
  std::vector<int> ids;
  ids.reserve(text.text.size() / 3);
  impl_->encode(text.text, text.untrusted, ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string bytes;
  for (int id : ids) bytes += token_text(id);
  std::string out;
  utf8::append_lossy(out, bytes, true);
  return out;
}

int Tokenizer::token_id(std::string_view token) const {
  auto it = impl_->spelling_to_id.find(token);
  return it == impl_->spelling_to_id.end() ? -1 : it->second;
}

const std::string& Tokenizer::token_text(int id) const {
  static const std::string none;
  if (id < 0 || size_t(id) >= impl_->id_bytes.size()) return none;
  return impl_->id_bytes[size_t(id)];
}

int Tokenizer::vocab_size() const { return int(impl_->id_bytes.size()); }

bool Tokenizer::is_special(int id) const {
  return id >= 0 && size_t(id) < impl_->id_kind.size() && impl_->id_kind[size_t(id)] == Kind::Special;
}

}  // namespace ms
