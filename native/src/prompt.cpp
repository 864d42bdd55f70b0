#include "prompt.h"

#include <stdexcept>

namespace forge {

std::vector<int> parse_ids(const std::string& s, const std::string& flag) {
  std::vector<int> ids;
  size_t start = 0;
  for (size_t entry = 1;; entry++) {
    size_t comma = s.find(',', start);
    std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t b = part.find_first_not_of(" "), e = part.find_last_not_of(" ");
    part = b == std::string::npos ? "" : part.substr(b, e - b + 1);
    // At most 9 digits: every such id fits an int; the vocabulary bound is checked against the manifest.
    if (part.empty() || part.size() > 9 || part.find_first_not_of("0123456789") != std::string::npos)
      throw std::runtime_error(flag + ": entry " + std::to_string(entry) + " '" + part + "' is not a token id");
    ids.push_back(std::stoi(part));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

}  // namespace forge
