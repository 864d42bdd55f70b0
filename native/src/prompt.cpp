#include "prompt.h"

#include <set>
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

/** The switches the bundle's template has (the names tokenizer.chatOptions sets). */
std::set<std::string> switch_names(const Manifest& m) {
  std::set<std::string> names;
  for (const Manifest::ChatOptionWrap& v : m.chat_options)
    for (const auto& [name, value] : v.options) names.insert(name);
  return names;
}

/** "enable_thinking (true|false), ...", for a refusal. */
std::string switch_list(const std::set<std::string>& names) {
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n + " (true|false)";
  return list;
}

std::string describe(const ChatOptions& options) {
  std::string s;
  for (const auto& [name, value] : options) s += (s.empty() ? "" : " ") + name + "=" + (value ? "true" : "false");
  return s;
}

/** The manifest's chat wrap for these options, or the refusal of --chat / --chat-option. */
const Manifest::ChatWrap& chat_wrap(const Manifest& m, const ChatOptions& options) {
  if (!m.chat && m.chat_not_applied)
    throw std::runtime_error("--chat: " + m.label + "'s chat template cannot be applied by the runtime (" + *m.chat_not_applied +
                             "); give the ids transformers' apply_chat_template renders with --prompt-ids, or the prompt as plain text");
  if (!m.chat)
    throw std::runtime_error("--chat: " + m.label + " has no chat template (tokenizer.chat is null: the checkpoint's tokenizer_config.json has no chat_template); give the prompt as plain text");
  if (options.empty()) return *m.chat;
  if (m.chat_options_not_applied)
    throw std::runtime_error("--chat-option " + describe(options) + ": " + m.label + "'s chat template's switches cannot be applied by the runtime (" +
                             *m.chat_options_not_applied + "); give the ids transformers' apply_chat_template renders with --prompt-ids");
  if (m.chat_options.empty())
    throw std::runtime_error("--chat-option " + describe(options) + ": " + m.label + "'s chat template has no options (it reads no switch such as enable_thinking); use --chat alone");
  const std::set<std::string> names = switch_names(m);
  const std::string has = switch_list(names);
  for (const auto& [name, value] : options)
    if (!names.count(name))
      throw std::runtime_error("--chat-option " + name + ": " + m.label + "'s chat template has no such option; its options: " + has);
  for (const Manifest::ChatOptionWrap& v : m.chat_options)
    if (v.options == options) return v.wrap;
  throw std::runtime_error("--chat-option " + describe(options) + ": " + m.label + " has no wrap for this combination (tokenizer.chatOptions lacks it); its options: " + has);
}

}  // namespace

void add_chat_option(ChatOptions& options, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  const std::string name = assignment.substr(0, eq), value = eq == std::string::npos ? "" : assignment.substr(eq + 1);
  if (eq == std::string::npos || name.empty())
    throw std::runtime_error("--chat-option '" + assignment + "': expected name=true or name=false (a switch of the chat template, e.g. enable_thinking=false)");
  if (value != "true" && value != "false")
    throw std::runtime_error("--chat-option " + name + ": the value '" + value + "' is not true or false");
  if (options.count(name)) throw std::runtime_error("--chat-option " + name + " given twice");
  options[name] = value == "true";
}

std::vector<int> text_prompt_ids(const Manifest& m, const Tokenizer& tok, const std::string& text, bool chat, const ChatOptions& options) {
  std::vector<int> ids;
  if (chat) {
    const Manifest::ChatWrap& wrap = chat_wrap(m, options);
    ids = tok.encode(wrap.prefix + text + wrap.suffix);
  } else {
    ids = tok.encode(text);
    if (m.bos) ids.insert(ids.begin(), *m.bos);
  }
  check_vocab(m, ids, "the tokenized prompt");
  return ids;
}

std::vector<int> image_prompt_ids(const Manifest& m, const Tokenizer& tok, const std::vector<int>& block, const std::string& text, bool chat,
                                  const ChatOptions& options) {
  std::vector<int> ids;
  if (!chat) {
    // After the BOS (Gemma's processor expands the image where its text puts it, the tokenizer adds the BOS before).
    ids = text_prompt_ids(m, tok, text, false);
    const size_t at = m.bos && !ids.empty() && ids[0] == *m.bos ? 1 : 0;
    ids.insert(ids.begin() + std::ptrdiff_t(at), block.begin(), block.end());
  } else {
    const Manifest::ChatWrap& wrap = chat_wrap(m, options);
    ids = tok.encode(wrap.prefix);
    ids.insert(ids.end(), block.begin(), block.end());
    std::vector<int> rest = tok.encode(text + wrap.suffix);
    ids.insert(ids.end(), rest.begin(), rest.end());
  }
  check_vocab(m, ids, "the image prompt");
  return ids;
}

}  // namespace forge
