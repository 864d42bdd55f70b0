// The manifest loader's reading helpers (internal to manifest.cpp): a JSON node that knows its field
// path, so every refusal names it, and the checker of the files a manifest lists.
#pragma once
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "manifest.h"
#include "sha256.h"
#include "utf8.h"

namespace forge::manifest_detail {

using json = nlohmann::json;

/** A JSON value with the field path that leads to it, so every complaint can name that path. */
struct Node {
  const json& j;
  std::string path;
  const std::string& label;

  [[noreturn]] void fail(const std::string& msg) const {
    throw ManifestError(one_line(label + ": " + (path.empty() ? "" : path + ": ") + msg));
  }
  std::string child(const std::string& key) const { return path.empty() ? key : path + "." + key; }

  /** Object with exactly these keys allowed (the schema is strict), the required ones present. */
  void object(std::initializer_list<const char*> required, std::initializer_list<const char*> optional = {}) const {
    if (!j.is_object()) fail("expected an object");
    for (const char* k : required)
      if (!j.contains(k)) Node{j, child(k), label}.fail("missing");
    for (auto it = j.begin(); it != j.end(); ++it) {
      auto known = [&](std::initializer_list<const char*> l) {
        return std::any_of(l.begin(), l.end(), [&](const char* k) { return it.key() == k; });
      };
      if (!known(required) && !known(optional)) Node{it.value(), child(it.key()), label}.fail("unknown field");
    }
  }
  bool has(const char* key) const { return j.contains(key); }
  Node at(const char* key) const {
    if (!j.is_object() || !j.contains(key)) Node{j, child(key), label}.fail("missing");
    return Node{j.at(key), child(key), label};
  }
  size_t array(size_t min_len = 0) const {
    if (!j.is_array()) fail("expected an array");
    if (j.size() < min_len) fail("expected at least " + std::to_string(min_len) + " entries");
    return j.size();
  }
  Node operator[](size_t i) const { return Node{j.at(i), path + "[" + std::to_string(i) + "]", label}; }
  std::string str() const {
    if (!j.is_string() || j.get<std::string>().empty()) fail("expected a non-empty string");
    return j.get<std::string>();
  }
  int64_t integer(int64_t min = INT64_MIN, int64_t max = INT64_MAX) const {
    if (!j.is_number_integer()) fail("expected an integer");
    if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(INT64_MAX)) fail(std::to_string(j.get<uint64_t>()) + " is above " + std::to_string(max));
    int64_t v = j.get<int64_t>();
    if (v < min) fail(std::to_string(v) + " is below " + std::to_string(min));
    if (v > max) fail(std::to_string(v) + " is above " + std::to_string(max));
    return v;
  }
  /** An integer the runtime keeps in an int: larger values would wrap, not fail. */
  int int32(int64_t min = INT32_MIN) const { return int(integer(min, INT32_MAX)); }
  std::string one_of(std::initializer_list<const char*> allowed) const {
    std::string v = str();
    for (const char* a : allowed)
      if (v == a) return v;
    std::string list;
    for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
    fail("'" + v + "' is not one of " + list);
  }
  std::string sha256() const {
    std::string v = str();
    if (v.size() != 64 || v.find_first_not_of("0123456789abcdef") != std::string::npos)
      fail("'" + v + "' is not a lowercase hex sha256");
    return v;
  }
  /** A path inside the bundle: relative, no '..' segment. */
  std::string rel_path() const {
    std::string v = str();
    if (v[0] == '/') fail("'" + v + "' must be a path inside the bundle");
    std::istringstream parts(v);
    for (std::string seg; std::getline(parts, seg, '/');)
      if (seg == "..") fail("'" + v + "' must be a path inside the bundle");
    return v;
  }
  std::vector<int64_t> shape() const {
    size_t n = array(1);
    std::vector<int64_t> out;
    for (size_t i = 0; i < n; i++) out.push_back((*this)[i].integer(1, INT32_MAX));
    return out;
  }
};

inline bool file_size(const std::string& path, uint64_t* size) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  *size = uint64_t(st.st_size);
  return true;
}

/** Checks files exist and hash right (as far as `verify` asks); a file named twice is hashed once. */
class FileChecker {
 public:
  FileChecker(const std::string& root, const LoadOptions& opts) : root_(root), opts_(opts) {}
  uint64_t exists(const Node& at, const std::string& rel) {
    uint64_t size = 0;
    if (!file_size(root_ + "/" + rel, &size)) at.fail("'" + rel + "' does not exist under " + root_);
    return size;
  }
  /** `size_checked`: the caller has checked the file's size against the manifest. */
  void check(const Node& at, const std::string& rel, const std::string& sha, bool size_checked = false) {
    uint64_t size = exists(at, rel);
    if (opts_.verify == Verify::none || (opts_.verify == Verify::small && size_checked && size > opts_.small_bytes)) return;
    auto it = cache_.find(rel);
    if (it == cache_.end()) it = cache_.emplace(rel, sha256_file(root_ + "/" + rel)).first;
    if (it->second != sha) at.fail("sha256 of '" + rel + "' is " + it->second + ", the manifest says " + sha);
  }

 private:
  std::string root_;
  LoadOptions opts_;
  std::map<std::string, std::string> cache_;
};

}  // namespace forge::manifest_detail
