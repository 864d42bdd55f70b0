#include "tokenizer.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "split_regex.h"
#include "unicode.h"
#include "utf8.h"

namespace forge {
namespace {

using json = nlohmann::json;

// The split ByteLevel applies by itself when use_regex is true (GPT-2's pattern).
const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

[[noreturn]] void refuse(const std::string& label, const std::string& what) {
  throw std::runtime_error(label + ": " + what + " is not supported by the native tokenizer");
}

bool truthy(const json& j, const char* key) { return j.is_object() && j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); }

}  // namespace

Tokenizer::Tokenizer() {
  // GPT-2's byte → character map: printable Latin-1 bytes stand for themselves, the others are
  // shifted to U+0100.. in byte order, so every token is printable text.
  int shifted = 0;
  for (int b = 0; b < 256; b++) {
    bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    byte_to_char_[b] = keep ? char32_t(b) : char32_t(256 + shifted++);
    char_to_byte_[byte_to_char_[b]] = uint8_t(b);
  }
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read tokenizer " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& label) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw std::runtime_error(one_line(label + ": not valid JSON: " + e.what()));
  }
  // Every failure below becomes one line naming the file and the field being read (`where`), be it
  // our own refusal, a JSON type error (a string where an id belongs) or an unsupported regex.
  Tokenizer t;
  std::string where = "(root)";
  try {
    t.load(j, label, where);
  } catch (const json::exception& e) {
    throw std::runtime_error(one_line(label + ": " + where + ": " + e.what()));
  } catch (const std::runtime_error& e) {
    std::string msg = e.what();
    throw std::runtime_error(one_line(msg.rfind(label + ": ", 0) == 0 ? msg : label + ": " + where + ": " + msg));
  }
  return t;
}

void Tokenizer::load(const json& j, const std::string& label, std::string& where) {
  Tokenizer& t = *this;
  where = "model";
  const json& model = j.at("model");
  if (!model.is_object()) throw std::runtime_error("expected an object");
  if (model.value("type", "") != "BPE") refuse(label, "model.type '" + model.value("type", "") + "'");
  if (truthy(model, "byte_fallback")) refuse(label, "model.byte_fallback");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty()) refuse(label, std::string("model.") + k);
  t.ignore_merges_ = truthy(model, "ignore_merges");

  where = "model.vocab";
  const json& vocab = model.at("vocab");
  if (!vocab.is_object()) throw std::runtime_error("expected an object of token → id");
  const json& added_tokens = j.value("added_tokens", json::array());
  if (!added_tokens.is_array()) throw std::runtime_error("added_tokens: expected an array");
  // Ids index the id → token table: each must lie below the number of entries that could fill it,
  // so a corrupt id can neither index outside the table nor make it absurdly large.
  const int64_t id_limit = int64_t(vocab.size() + added_tokens.size());
  auto checked_id = [&](const json& v) {
    if (!v.is_number_integer()) throw std::runtime_error("id " + v.dump() + " is not an integer");
    int64_t id = v.get<int64_t>();
    if (id < 0 || id >= id_limit) throw std::runtime_error("id " + std::to_string(id) + " is outside [0, " + std::to_string(id_limit) + ") (the number of vocab and added entries)");
    return int(id);
  };
  int max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    where = "model.vocab[" + json(it.key()).dump(-1, ' ', true, json::error_handler_t::replace) + "]";
    int id = checked_id(it.value());
    t.vocab_[utf8_decode(it.key())] = id;
    max_id = std::max(max_id, id);
  }
  for (size_t i = 0; i < added_tokens.size(); i++) {
    where = "added_tokens[" + std::to_string(i) + "]";
    const json& a = added_tokens[i];
    if (truthy(a, "single_word")) refuse(label, "added token with single_word");
    Added added{utf8_decode(a.at("content").get<std::string>()), checked_id(a.at("id")), truthy(a, "lstrip"),
                truthy(a, "rstrip"), truthy(a, "special"), truthy(a, "normalized")};
    max_id = std::max(max_id, added.id);
    t.added_.push_back(std::move(added));
  }
  t.id_to_token_.assign(size_t(max_id + 1), "");
  t.special_.assign(size_t(max_id + 1), false);
  for (const auto& [tok, id] : t.vocab_) t.id_to_token_[size_t(id)] = utf8_encode(tok);
  for (const Added& a : t.added_) {
    t.id_to_token_[size_t(a.id)] = utf8_encode(a.content);
    t.special_[size_t(a.id)] = a.special;
  }

  where = "model.merges";
  const json& merges = model.at("merges");
  if (!merges.is_array()) throw std::runtime_error("expected an array");
  for (size_t rank = 0; rank < merges.size(); rank++) {
    where = "model.merges[" + std::to_string(rank) + "]";
    std::string left, right;
    if (merges[rank].is_array()) {  // ["a", "b"] (newer files)
      left = merges[rank].at(0).get<std::string>();
      right = merges[rank].at(1).get<std::string>();
    } else {  // "a b"
      std::string m = merges[rank].get<std::string>();
      size_t sp = m.find(' ');
      if (sp == std::string::npos) throw std::runtime_error(label + ": merge '" + m + "' has no space");
      left = m.substr(0, sp);
      right = m.substr(sp + 1);
    }
    auto l = t.vocab_.find(utf8_decode(left)), r = t.vocab_.find(utf8_decode(right)), lr = t.vocab_.find(utf8_decode(left + right));
    if (l == t.vocab_.end() || r == t.vocab_.end() || lr == t.vocab_.end())
      throw std::runtime_error(label + ": merge " + std::to_string(rank) + " ('" + left + "' '" + right + "') names a token outside the vocabulary");
    t.merges_.emplace(uint64_t(uint32_t(l->second)) << 32 | uint32_t(r->second), std::make_pair(int(rank), lr->second));
  }

  // normalizer: none or NFC (possibly alone in a Sequence).
  where = "normalizer";
  const json& norm = j.value("normalizer", json());
  if (!norm.is_null()) {
    std::string type = norm.value("type", "");
    if (type == "NFC") t.nfc_ = true;
    else if (type == "Sequence" && norm.at("normalizers").size() == 1 && norm["normalizers"][0].value("type", "") == "NFC") t.nfc_ = true;
    else if (!(type == "Sequence" && norm.at("normalizers").empty())) refuse(label, "normalizer '" + norm.dump() + "'");
  }

  // pre_tokenizer: ByteLevel(use_regex) or Sequence[Split(regex, Isolated), ByteLevel(no regex)].
  where = "pre_tokenizer";
  const json& pre = j.value("pre_tokenizer", json());
  auto byte_level = [&](const json& b, bool regex_allowed) {
    t.add_prefix_space_ = truthy(b, "add_prefix_space");
    if (b.value("use_regex", true)) {
      if (!regex_allowed) refuse(label, "a ByteLevel pre-tokenizer with use_regex after a Split");
      t.split_ = std::make_unique<SplitRegex>(kGpt2Pattern);
    }
  };
  std::string pre_type = pre.is_null() ? "" : pre.value("type", "");
  if (pre_type == "ByteLevel") {
    byte_level(pre, true);
  } else if (pre_type == "Sequence" && pre.at("pretokenizers").size() == 2 && pre["pretokenizers"][0].value("type", "") == "Split" &&
             pre["pretokenizers"][1].value("type", "") == "ByteLevel") {
    const json& split = pre["pretokenizers"][0];
    if (split.value("behavior", "") != "Isolated" || truthy(split, "invert") || !split.at("pattern").contains("Regex"))
      refuse(label, "pre_tokenizer Split '" + split.dump() + "'");
    t.split_ = std::make_unique<SplitRegex>(split["pattern"]["Regex"].get<std::string>());
    byte_level(pre["pretokenizers"][1], false);
    if (t.add_prefix_space_) refuse(label, "ByteLevel add_prefix_space after a Split");
  } else {
    refuse(label, "pre_tokenizer '" + pre.dump().substr(0, 200) + "'");
  }
  where = "decoder";
  const json& dec = j.value("decoder", json());
  if (dec.is_null() || dec.value("type", "") != "ByteLevel") refuse(label, "decoder '" + dec.dump().substr(0, 200) + "'");
}

void Tokenizer::split_added(std::vector<Piece>& pieces, bool normalized) const {
  std::vector<const Added*> cands;
  for (const Added& a : added_)
    if (a.normalized == normalized) cands.push_back(&a);
  if (cands.empty()) return;
  std::vector<Piece> out;
  for (Piece& p : pieces) {
    if (p.added_id >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    const std::u32string& s = p.text;
    size_t text_start = 0;
    for (size_t i = 0; i < s.size();) {
      const Added* best = nullptr;  // leftmost-longest, as HF's Aho-Corasick trie matches
      for (const Added* a : cands)
        if (!a->content.empty() && s.compare(i, a->content.size(), a->content) == 0 && (!best || a->content.size() > best->content.size()))
          best = a;
      if (!best) {
        i++;
        continue;
      }
      size_t b = i, e = i + best->content.size();
      if (best->lstrip)
        while (b > text_start && is_space(s[b - 1])) b--;
      if (best->rstrip)
        while (e < s.size() && is_space(s[e])) e++;
      if (b > text_start) out.push_back({s.substr(text_start, b - text_start), -1});
      out.push_back({U"", best->id});
      text_start = i = e;
    }
    if (text_start < s.size()) out.push_back({s.substr(text_start), -1});
  }
  pieces = std::move(out);
}

void Tokenizer::bpe(const std::u32string& word, std::vector<int>& out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int> sym;
  for (char32_t c : word) {
    auto it = vocab_.find(std::u32string(1, c));
    if (it != vocab_.end()) sym.push_back(it->second);  // no unk token: an unknown symbol is dropped, as HF does
  }
  // Merge the lowest-ranked adjacent pair (leftmost on ties) until none is in the merge table.
  for (;;) {
    int best_rank = -1, best_id = 0;
    size_t best_pos = 0;
    for (size_t i = 0; i + 1 < sym.size(); i++) {
      auto it = merges_.find(uint64_t(uint32_t(sym[i])) << 32 | uint32_t(sym[i + 1]));
      if (it != merges_.end() && (best_rank < 0 || it->second.first < best_rank)) {
        best_rank = it->second.first;
        best_id = it->second.second;
        best_pos = i;
      }
    }
    if (best_rank < 0) break;
    sym[best_pos] = best_id;
    sym.erase(sym.begin() + long(best_pos) + 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

std::vector<int> Tokenizer::encode(const std::string& text) const {
  std::vector<Piece> pieces{{utf8_decode(text), -1}};
  split_added(pieces, false);
  if (nfc_)
    for (Piece& p : pieces)
      if (p.added_id < 0) p.text = nfc(p.text);
  split_added(pieces, true);
  std::vector<int> ids;
  for (const Piece& p : pieces) {
    if (p.added_id >= 0) {
      ids.push_back(p.added_id);
      continue;
    }
    std::u32string s = p.text;
    if (add_prefix_space_ && !s.empty() && s[0] != U' ') s.insert(s.begin(), U' ');
    std::vector<std::u32string> words = split_ ? split_->split_isolated(s) : std::vector<std::u32string>{s};
    for (const std::u32string& w : words) {
      std::u32string mapped;
      for (unsigned char b : utf8_encode(w)) mapped += byte_to_char_[b];
      bpe(mapped, ids);
    }
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids, bool skip_special) const {
  std::string bytes;
  for (int id : ids) {
    if (id < 0 || size_t(id) >= id_to_token_.size()) throw std::runtime_error("token id " + std::to_string(id) + " is outside the tokenizer's vocabulary");
    if (skip_special && special_[size_t(id)]) continue;
    const std::string& tok = id_to_token_[size_t(id)];
    // ByteLevel decoding: a token made only of mapped characters turns back into its bytes; any
    // other token (an added token with, say, a space) is taken as the UTF-8 it is.
    std::string raw;
    bool mapped = true;
    for (char32_t c : utf8_decode(tok)) {
      auto it = char_to_byte_.find(c);
      if (it == char_to_byte_.end()) { mapped = false; break; }
      raw += char(it->second);
    }
    bytes += mapped ? raw : tok;
  }
  return utf8_lossy(bytes);
}

}  // namespace forge
