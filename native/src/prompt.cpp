#include "prompt.h"

#include <stdexcept>

#include "manifest.h"
#include "tokenizer.h"

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

void check_vocab(const Manifest& m, const std::vector<int>& ids, const std::string& what) {
  for (size_t i = 0; i < ids.size(); i++)
    if (ids[i] < 0 || ids[i] >= m.vocab)
      throw std::runtime_error(what + ": entry " + std::to_string(i + 1) + " token id " + std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                               std::to_string(m.vocab) + ")");
}

namespace {

/** The manifest's chat wrap, or the refusal of --chat. */
const Manifest::ChatWrap& chat_wrap(const Manifest& m) {
  if (!m.chat && m.chat_not_applied)
    throw std::runtime_error("--chat: " + m.label + "'s chat template cannot be applied by the runtime (" + *m.chat_not_applied +
                             "); give the ids transformers' apply_chat_template renders with --prompt-ids, or the prompt as plain text");
  if (!m.chat)
    throw std::runtime_error("--chat: " + m.label + " has no chat template (tokenizer.chat is null: the checkpoint's tokenizer_config.json has no chat_template); give the prompt as plain text");
  return *m.chat;
}

}  // namespace

std::vector<int> text_prompt_ids(const Manifest& m, const Tokenizer& tok, const std::string& text, bool chat) {
  std::vector<int> ids;
  if (chat) {
    const Manifest::ChatWrap& wrap = chat_wrap(m);
    ids = tok.encode(wrap.prefix + text + wrap.suffix);
  } else {
    ids = tok.encode(text);
    if (m.bos) ids.insert(ids.begin(), *m.bos);
  }
  check_vocab(m, ids, "the tokenized prompt");
  return ids;
}

std::vector<int> image_prompt_ids(const Manifest& m, const Tokenizer& tok, const std::vector<int>& block, const std::string& text, bool chat) {
  std::vector<int> ids;
  if (!chat) {
    ids = block;
    std::vector<int> rest = text_prompt_ids(m, tok, text, false);
    ids.insert(ids.end(), rest.begin(), rest.end());
  } else {
    const Manifest::ChatWrap& wrap = chat_wrap(m);
    ids = tok.encode(wrap.prefix);
    ids.insert(ids.end(), block.begin(), block.end());
    std::vector<int> rest = tok.encode(text + wrap.suffix);
    ids.insert(ids.end(), rest.begin(), rest.end());
  }
  check_vocab(m, ids, "the image prompt");
  return ids;
}

}  // namespace forge
