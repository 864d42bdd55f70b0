// Byte-level BPE over an HF tokenizers `tokenizer.json` (the format Qwen, GPT-2 and Llama-3 ship):
// added/special tokens matched first (leftmost-longest, lstrip/rstrip honoured), optional NFC
// normaliser, the pre-tokenizer's split regex (Split "Isolated" + ByteLevel, or ByteLevel with its
// built-in GPT-2 regex), the byte → printable-character map, then BPE merges by rank. Decoding maps
// ids back to bytes (ByteLevel decoder) and to text the way HF does (invalid UTF-8 → U+FFFD).
// Anything in the file this does not implement is refused when it is loaded, naming the field.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace forge {

class SplitRegex;

class Tokenizer {
 public:
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_json(const std::string& json_text, const std::string& label);
  Tokenizer(Tokenizer&&) noexcept;
  ~Tokenizer();

  /** Token ids of `text`; adds no BOS/EOS (the host-op adds what the manifest says). */
  std::vector<int> encode(const std::string& text) const;
  std::string decode(const std::vector<int>& ids, bool skip_special = false) const;
  size_t vocab_size() const { return id_to_token_.size(); }

 private:
  Tokenizer();
  /** Fills this from a parsed tokenizer.json; `where` follows the field being read, for errors. */
  void load(const nlohmann::json& j, const std::string& label, std::string& where);
  struct Added {
    std::u32string content;
    int id;
    bool lstrip, rstrip, special, normalized;
  };
  struct Piece {
    std::u32string text;
    int added_id;  // -1 for text still to tokenize
  };
  void split_added(std::vector<Piece>& pieces, bool normalized) const;
  void bpe(const std::u32string& word, std::vector<int>& out) const;

  std::vector<Added> added_;
  bool nfc_ = false;
  bool add_prefix_space_ = false;
  std::unique_ptr<SplitRegex> split_;
  std::unordered_map<std::u32string, int> vocab_;
  std::vector<std::string> id_to_token_;  // UTF-8, byte-level encoded for model tokens
  std::vector<bool> special_;
  std::unordered_map<uint64_t, std::pair<int, int>> merges_;  // (left id, right id) → (rank, merged id)
  bool ignore_merges_ = false;
  char32_t byte_to_char_[256];
  std::unordered_map<char32_t, uint8_t> char_to_byte_;
};

}  // namespace forge
