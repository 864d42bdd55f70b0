// A small backtracking regex engine for the split patterns of byte-level BPE pre-tokenizers
// (GPT-2, GPT-4/cl100k, Qwen, Llama-3 style). It implements the subset those patterns use, with
// the same leftmost-first semantics as Oniguruma (which HF tokenizers uses):
//   alternation, (?:...), (?i:...) (ASCII case folding plus ſ/K), (?!...), (?=...),
//   ? * + {n} {n,} {n,m} (greedy; lazy with a trailing ?), classes [...] and [^...],
//   \p{L} \p{N} \p{M} \p{Nd} and \P{..}, \s \S \d \D, \r \n \t \f \v, escaped punctuation, '.'.
// Anything else is refused when the pattern is compiled, naming the construct.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace forge {

class SplitRegex {
 public:
  explicit SplitRegex(const std::string& pattern);
  /** Leftmost-first match starting exactly at `pos`; returns its end, or -1. */
  long match_at(const std::u32string& text, size_t pos) const;
  /** Non-overlapping matches scanning left to right, as [begin, end) pairs. */
  std::vector<std::pair<size_t, size_t>> find_all(const std::u32string& text) const;
  /** "Isolated" split: matches and the text between them, in order, empty pieces dropped. */
  std::vector<std::u32string> split_isolated(const std::u32string& text) const;

  struct Class {
    std::vector<std::pair<char32_t, char32_t>> ranges;
    std::vector<std::pair<uint8_t, bool>> props;  // (UnicodeProp, negated)
    bool negated = false;
    bool matches(char32_t c) const;
  };
  enum Op : uint8_t { kClass, kSplit, kJmp, kMatch, kLook };
  struct Inst {
    Op op;
    int x = 0, y = 0;  // class index / branch targets / lookahead body and continuation
    bool negative = false;
  };

 private:
  bool run(int pc, const std::u32string& text, size_t sp, size_t* end) const;
  std::vector<Class> classes_;
  std::vector<Inst> prog_;
};

}  // namespace forge
