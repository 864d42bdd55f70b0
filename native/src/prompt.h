// The prompt of qhx_generate given as token ids (`--prompt-ids 12,5,7`). Text is never taken for
// ids: a prompt of digits ("42") is text like any other and is tokenized.
#pragma once
#include <string>
#include <vector>

namespace forge {

/** Parses "12,5,7"; throws std::runtime_error naming the flag (`--prompt-ids`, `--force-ids`) and the bad entry. */
std::vector<int> parse_ids(const std::string& s, const std::string& flag = "--prompt-ids");

}  // namespace forge
