#include "unicode.h"

#include <algorithm>
#include <unordered_map>

namespace forge {
namespace {

#include "unicode_tables.inc"

template <size_t W, size_t N>
const uint32_t* find_range(const uint32_t (&table)[N][W], char32_t cp) {
  size_t lo = 0, hi = N;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (table[mid][1] < cp) lo = mid + 1;
    else hi = mid;
  }
  return lo < N && table[lo][0] <= cp ? table[lo] : nullptr;
}

template <size_t N>
bool in(const uint32_t (&table)[N][2], char32_t cp) { return find_range(table, cp) != nullptr; }

int ccc(char32_t cp) {
  if (cp < 0x300) return 0;
  const uint32_t* r = find_range(kCombining, cp);
  return r ? int(r[2]) : 0;
}

// Hangul syllables decompose and compose arithmetically (Unicode ch. 3.12).
constexpr char32_t SBase = 0xAC00, LBase = 0x1100, VBase = 0x1161, TBase = 0x11A7;
constexpr int LCount = 19, VCount = 21, TCount = 28, NCount = VCount * TCount, SCount = LCount * NCount;

struct DecompIndex {
  std::unordered_map<char32_t, const uint32_t*> decomp;
  std::unordered_map<uint64_t, char32_t> compose;
  DecompIndex() {
    for (const auto& row : kDecomp) {
      decomp[row[0]] = row;
      if (row[3]) compose[uint64_t(row[1]) << 32 | row[2]] = row[0];
    }
  }
};

const DecompIndex& index() {
  static const DecompIndex idx;
  return idx;
}

void decompose(char32_t cp, std::u32string& out) {
  if (cp >= SBase && cp < SBase + SCount) {
    int s = int(cp - SBase);
    out += char32_t(LBase + s / NCount);
    out += char32_t(VBase + (s % NCount) / TCount);
    if (s % TCount) out += char32_t(TBase + s % TCount);
    return;
  }
  auto it = index().decomp.find(cp);
  if (it == index().decomp.end()) {
    out += cp;
    return;
  }
  decompose(it->second[1], out);
  if (it->second[2]) decompose(it->second[2], out);
}

char32_t compose(char32_t a, char32_t b) {
  if (a >= LBase && a < LBase + LCount && b >= VBase && b < VBase + VCount)
    return SBase + ((a - LBase) * VCount + (b - VBase)) * TCount;
  if (a >= SBase && a < SBase + SCount && (a - SBase) % TCount == 0 && b > TBase && b < TBase + TCount)
    return a + (b - TBase);
  auto it = index().compose.find(uint64_t(a) << 32 | b);
  return it == index().compose.end() ? 0 : it->second;
}

}  // namespace

bool has_prop(char32_t cp, UnicodeProp prop) {
  switch (prop) {
    case kPropLetter: return in(kLetter, cp);
    case kPropNumber: return in(kNumber, cp);
    case kPropMark: return in(kMark, cp);
    case kPropDigit: return in(kDigit, cp);
    case kPropSpace: return in(kSpace, cp);
  }
  return false;
}

bool is_space(char32_t cp) { return in(kSpace, cp); }

std::u32string nfc(const std::u32string& s) {
  // Nothing below U+0300 decomposes to, or composes with, anything else: skip the work.
  if (std::all_of(s.begin(), s.end(), [](char32_t c) { return c < 0x300; })) return s;
  std::u32string d;
  for (char32_t cp : s) decompose(cp, d);
  // Canonical order: stable-sort each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (!ccc(d[i])) { i++; continue; }
    size_t j = i;
    while (j < d.size() && ccc(d[j])) j++;
    std::stable_sort(d.begin() + i, d.begin() + j, [](char32_t a, char32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  // Canonical composition: each character joins the last starter unless blocked.
  std::u32string out;
  size_t starter = std::u32string::npos;
  int last_ccc = -1;
  for (char32_t cp : d) {
    int c = ccc(cp);
    if (starter != std::u32string::npos && (last_ccc < c || (last_ccc == 0 && out.size() == starter + 1))) {
      if (char32_t comp = compose(out[starter], cp)) {
        out[starter] = comp;
        continue;
      }
    }
    if (c == 0) {
      starter = out.size();
      last_ccc = 0;
    } else {
      last_ccc = c;
    }
    out += cp;
  }
  return out;
}

}  // namespace forge
