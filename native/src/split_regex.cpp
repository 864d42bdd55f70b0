#include "split_regex.h"

#include <stdexcept>

#include "unicode.h"
#include "utf8.h"

namespace forge {
namespace {

struct Node {
  enum Kind { kCls, kSeq, kAlt, kRep, kLook } kind;
  int cls = -1;
  std::vector<Node> kids;
  int min = 0, max = -1;  // kRep; max -1 = unbounded
  bool greedy = true;
  bool negative = false;  // kLook
};

bool nullable(const Node& n) {
  switch (n.kind) {
    case Node::kCls: return false;
    case Node::kLook: return true;
    case Node::kRep: return n.min == 0 || nullable(n.kids[0]);
    case Node::kSeq:
      for (const Node& k : n.kids)
        if (!nullable(k)) return false;
      return true;
    case Node::kAlt:
      for (const Node& k : n.kids)
        if (nullable(k)) return true;
      return false;
  }
  return false;
}

class Parser {
 public:
  Parser(const std::string& pattern, std::vector<SplitRegex::Class>& classes)
      : src_(pattern), p_(utf8_decode(pattern)), classes_(classes) {}

  Node parse() {
    Node n = alt(false);
    if (i_ < p_.size()) fail("unbalanced ')'");
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("split regex " + src_ + ": " + what + " at offset " + std::to_string(i_) + " (not supported by this tokenizer)");
  }
  bool more() const { return i_ < p_.size(); }
  char32_t peek() const { return more() ? p_[i_] : 0; }

  Node alt(bool icase) {
    Node a{Node::kAlt};
    a.kids.push_back(seq(icase));
    while (more() && peek() == '|') {
      i_++;
      a.kids.push_back(seq(icase));
    }
    return a.kids.size() == 1 ? std::move(a.kids[0]) : a;
  }

  Node seq(bool icase) {
    Node s{Node::kSeq};
    while (more() && peek() != '|' && peek() != ')') s.kids.push_back(quantified(atom(icase)));
    return s;
  }

  int number() {
    if (!more() || peek() < '0' || peek() > '9') fail("expected a number");
    int v = 0;
    while (more() && peek() >= '0' && peek() <= '9') v = v * 10 + int(p_[i_++] - '0');
    return v;
  }

  Node quantified(Node atom) {
    if (!more()) return atom;
    int mn, mx;
    char32_t c = peek();
    if (c == '?') { mn = 0; mx = 1; }
    else if (c == '*') { mn = 0; mx = -1; }
    else if (c == '+') { mn = 1; mx = -1; }
    else if (c == '{') {
      i_++;
      mn = mx = number();
      if (peek() == ',') {
        i_++;
        mx = peek() == '}' ? -1 : number();
      }
      if (peek() != '}') fail("expected '}'");
    } else {
      return atom;
    }
    i_++;
    Node r{Node::kRep};
    r.min = mn;
    r.max = mx;
    if (more() && peek() == '?') { r.greedy = false; i_++; }
    else if (more() && peek() == '+') fail("possessive quantifier");
    if (mx == -1 && nullable(atom)) fail("a repeated group that can match empty");
    r.kids.push_back(std::move(atom));
    return r;
  }

  Node cls_node(SplitRegex::Class c) {
    classes_.push_back(std::move(c));
    Node n{Node::kCls};
    n.cls = int(classes_.size() - 1);
    return n;
  }

  static void add_char(SplitRegex::Class& c, char32_t ch, bool icase) {
    c.ranges.push_back({ch, ch});
    if (!icase) return;
    // ASCII case folding, plus the two non-ASCII characters Unicode folds onto ASCII letters.
    if (ch >= 'a' && ch <= 'z') c.ranges.push_back({ch - 32, ch - 32});
    if (ch >= 'A' && ch <= 'Z') c.ranges.push_back({ch + 32, ch + 32});
    if (ch == 's' || ch == 'S') c.ranges.push_back({0x17F, 0x17F});
    if (ch == 'k' || ch == 'K') c.ranges.push_back({0x212A, 0x212A});
  }

  /** After a backslash: adds the escape's meaning to `c`; returns the literal when it is one, else 0. */
  char32_t escape(SplitRegex::Class& c) {
    if (!more()) fail("trailing backslash");
    char32_t e = p_[i_++];
    switch (e) {
      case 's': c.props.push_back({kPropSpace, false}); return 0;
      case 'S': c.props.push_back({kPropSpace, true}); return 0;
      case 'd': c.props.push_back({kPropDigit, false}); return 0;
      case 'D': c.props.push_back({kPropDigit, true}); return 0;
      case 'p':
      case 'P': {
        std::u32string name;
        if (peek() == '{') {
          i_++;
          while (more() && peek() != '}') name += p_[i_++];
          if (!more()) fail("unterminated \\p{");
          i_++;
        } else {
          name = p_.substr(i_++, 1);
        }
        uint8_t prop = name == U"L" ? kPropLetter : name == U"N" ? kPropNumber : name == U"M" ? kPropMark : name == U"Nd" ? kPropDigit : 0;
        if (!prop) fail("property \\p{" + utf8_encode(name) + "}");
        c.props.push_back({prop, e == 'P'});
        return 0;
      }
      case 'r': return '\r';
      case 'n': return '\n';
      case 't': return '\t';
      case 'f': return '\f';
      case 'v': return '\v';
      default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) fail(std::string("escape \\") + char(e));
        return e;  // escaped punctuation is itself
    }
  }

  Node bracket(bool icase) {
    SplitRegex::Class c;
    if (peek() == '^') { c.negated = true; i_++; }
    bool first = true;
    while (more() && (peek() != ']' || first)) {
      first = false;
      char32_t lo = p_[i_++];
      if (lo == '[') fail("nested class");
      if (lo == '\\' && !(lo = escape(c))) continue;
      if (peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        i_++;
        char32_t hi = p_[i_++];
        if (hi == '\\' && !(hi = escape(c))) fail("class range ending in a class escape");
        if (hi < lo) fail("reversed range");
        if (icase) fail("a range under (?i)");
        c.ranges.push_back({lo, hi});
      } else {
        add_char(c, lo, icase);
      }
    }
    if (!more()) fail("unterminated [");
    i_++;
    return cls_node(std::move(c));
  }

  Node atom(bool icase) {
    char32_t c = p_[i_++];
    SplitRegex::Class k;
    switch (c) {
      case '(': {
        bool inner_icase = icase;
        Node look{Node::kLook};
        bool is_look = false;
        if (peek() == '?') {
          i_++;
          char32_t t = more() ? p_[i_++] : 0;
          if (t == 'i' && peek() == ':') { inner_icase = true; i_++; }
          else if (t == '!' || t == '=') { is_look = true; look.negative = t == '!'; }
          else if (t != ':') fail("group (?" + utf8_encode(std::u32string(1, t)));
        }
        Node body = alt(inner_icase);
        if (peek() != ')') fail("expected ')'");
        i_++;
        if (!is_look) return body;
        look.kids.push_back(std::move(body));
        return look;
      }
      case '[': return bracket(icase);
      case '\\': {
        if (char32_t lit = escape(k)) add_char(k, lit, icase);
        return cls_node(std::move(k));
      }
      case '.':
        k.negated = true;
        k.ranges.push_back({'\n', '\n'});
        return cls_node(std::move(k));
      case '^': case '$': case ')': case '*': case '+': case '?': case '{':
        i_--;
        fail(std::string("'") + char(c) + "'");
      default:
        add_char(k, c, icase);
        return cls_node(std::move(k));
    }
  }

  std::string src_;
  std::u32string p_;
  size_t i_ = 0;
  std::vector<SplitRegex::Class>& classes_;
};

void compile(const Node& n, std::vector<SplitRegex::Inst>& prog) {
  using I = SplitRegex::Inst;
  switch (n.kind) {
    case Node::kCls: prog.push_back(I{SplitRegex::kClass, n.cls}); break;
    case Node::kSeq:
      for (const Node& k : n.kids) compile(k, prog);
      break;
    case Node::kAlt: {
      std::vector<size_t> jumps;
      for (size_t a = 0; a < n.kids.size(); a++) {
        size_t split = prog.size();
        bool last = a + 1 == n.kids.size();
        if (!last) prog.push_back(I{SplitRegex::kSplit, int(split + 1)});
        compile(n.kids[a], prog);
        if (!last) {
          jumps.push_back(prog.size());
          prog.push_back(I{SplitRegex::kJmp});
          prog[split].y = int(prog.size());
        }
      }
      for (size_t j : jumps) prog[j].x = int(prog.size());
      break;
    }
    case Node::kRep: {
      for (int r = 0; r < n.min; r++) compile(n.kids[0], prog);
      std::vector<size_t> splits;
      int optional = n.max < 0 ? 1 : n.max - n.min;
      for (int r = 0; r < optional; r++) {
        size_t split = prog.size();
        prog.push_back(I{SplitRegex::kSplit, int(split + 1)});
        compile(n.kids[0], prog);
        if (n.max < 0) prog.push_back(I{SplitRegex::kJmp, int(split)});
        splits.push_back(split);
      }
      for (size_t s : splits) {
        prog[s].y = int(prog.size());
        if (!n.greedy) std::swap(prog[s].x, prog[s].y);
      }
      break;
    }
    case Node::kLook: {
      size_t look = prog.size();
      prog.push_back(I{SplitRegex::kLook, int(look + 1)});
      prog[look].negative = n.negative;
      compile(n.kids[0], prog);
      prog.push_back(I{SplitRegex::kMatch});
      prog[look].y = int(prog.size());
      break;
    }
  }
}

}  // namespace

bool SplitRegex::Class::matches(char32_t c) const {
  bool hit = false;
  for (const auto& r : ranges)
    if (c >= r.first && c <= r.second) { hit = true; break; }
  for (size_t i = 0; !hit && i < props.size(); i++) hit = has_prop(c, UnicodeProp(props[i].first)) != props[i].second;
  return hit != negated;
}

SplitRegex::SplitRegex(const std::string& pattern) {
  Node root = Parser(pattern, classes_).parse();
  compile(root, prog_);
  prog_.push_back(Inst{kMatch});
}

bool SplitRegex::run(int pc0, const std::u32string& text, size_t sp0, size_t* end) const {
  std::vector<std::pair<int, size_t>> stack{{pc0, sp0}};
  while (!stack.empty()) {
    auto [pc, sp] = stack.back();
    stack.pop_back();
    for (;;) {
      const Inst& in = prog_[size_t(pc)];
      if (in.op == kClass) {
        if (sp < text.size() && classes_[size_t(in.x)].matches(text[sp])) { pc++; sp++; continue; }
        break;
      }
      if (in.op == kJmp) { pc = in.x; continue; }
      if (in.op == kSplit) { stack.push_back({in.y, sp}); pc = in.x; continue; }
      if (in.op == kMatch) { *end = sp; return true; }
      size_t ignored;  // kLook: a zero-width test from here
      if (run(in.x, text, sp, &ignored) != in.negative) { pc = in.y; continue; }
      break;
    }
  }
  return false;
}

long SplitRegex::match_at(const std::u32string& text, size_t pos) const {
  size_t end;
  return run(0, text, pos, &end) ? long(end) : -1;
}

std::vector<std::pair<size_t, size_t>> SplitRegex::find_all(const std::u32string& text) const {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t pos = 0; pos < text.size();) {
    long end = match_at(text, pos);
    if (end > long(pos)) {
      out.push_back({pos, size_t(end)});
      pos = size_t(end);
    } else {
      pos++;  // no match here (or an empty one): try the next position
    }
  }
  return out;
}

std::vector<std::u32string> SplitRegex::split_isolated(const std::u32string& text) const {
  std::vector<std::u32string> out;
  size_t prev = 0;
  for (auto [b, e] : find_all(text)) {
    if (b > prev) out.push_back(text.substr(prev, b - prev));
    out.push_back(text.substr(b, e - b));
    prev = e;
  }
  if (prev < text.size()) out.push_back(text.substr(prev));
  return out;
}

}  // namespace forge
