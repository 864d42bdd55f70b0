// The prompt argument of qhx_generate: text to tokenize, or a comma-separated token-id list.
#pragma once
#include <string>
#include <vector>

namespace forge {

/** True for "12,5,7"-style input (digits and commas only, at least one digit). */
bool looks_like_ids(const std::string& s);
/** Parses "12,5,7"; throws std::runtime_error naming the bad entry. */
std::vector<int> parse_ids(const std::string& s);

}  // namespace forge
