#include "utf8.h"

#include <cstdio>
#include <stdexcept>

namespace forge {
namespace {

/** Length of the valid sequence at s[i] (1..4), or 0 with `*bad` = bytes of its maximal invalid subpart. */
size_t valid_len(const std::string& s, size_t i, size_t* bad, char32_t* cp) {
  auto b = [&](size_t k) { return uint8_t(s[i + k]); };
  uint8_t c = b(0);
  *bad = 1;
  if (c < 0x80) { *cp = c; return 1; }
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) { n = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
  else if (c >= 0xF0 && c <= 0xF4) { n = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
  else return 0;
  char32_t v = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; k++) {
    if (i + k >= s.size()) return 0;
    uint8_t x = b(k);
    if (x < (k == 1 ? lo : 0x80) || x > (k == 1 ? hi : 0xBF)) return 0;
    v = (v << 6) | (x & 0x3F);
    *bad = k + 1;
  }
  *cp = v;
  return n;
}

}  // namespace

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    size_t bad;
    char32_t cp;
    size_t n = valid_len(s, i, &bad, &cp);
    if (!n) throw std::runtime_error("text is not valid UTF-8 (byte " + std::to_string(i) + ")");
    out += cp;
    i += n;
  }
  return out;
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  for (char32_t cp : s) utf8_append(out, cp);
  return out;
}

std::string utf8_lossy(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t bad;
    char32_t cp;
    size_t n = valid_len(s, i, &bad, &cp);
    if (n) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad;
    }
  }
  return out;
}

std::string one_line(const std::string& msg) {
  std::string out;
  for (unsigned char c : msg) {
    if (c >= 0x20 && c != 0x7f) out += char(c);
    else if (c == '\n') out += "\\n";
    else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace forge
