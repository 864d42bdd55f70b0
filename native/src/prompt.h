// The prompt of qhx_generate: text, tokenized (and, with --chat, wrapped in the model's chat
// template first), or token ids given as such (`--prompt-ids 12,5,7`). Text is never taken for
// ids: a prompt of digits ("42") is text like any other and is tokenized.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace forge {

struct Manifest;
class Tokenizer;

/** The chat template's switches a prompt sets (`--chat-option enable_thinking=false`); empty: none given. */
using ChatOptions = std::map<std::string, bool>;

/**
 * Adds one `--chat-option` value, `name=true` or `name=false`, to `options`; throws naming the flag
 * when it is not of that form or names a switch twice. Whether the bundle has the switch is
 * text_prompt_ids' question (it needs the manifest).
 */
void add_chat_option(ChatOptions& options, const std::string& assignment);

/** Parses "12,5,7"; throws std::runtime_error naming the flag (`--prompt-ids`, `--force-ids`) and the bad entry. */
std::vector<int> parse_ids(const std::string& s, const std::string& flag = "--prompt-ids");

/**
 * The token ids of a text prompt. Plain: the text tokenized, the manifest's BOS (if any) before it.
 * chat: tokenizer.chat's prefix + text + suffix tokenized as one text, nothing added, which is what
 * transformers' apply_chat_template(add_generation_prompt=True, tokenize=True) feeds the model (it
 * tokenizes the rendered text without special tokens: a template that wants BOS renders it, and it
 * is then in the prefix). `options`: the wrap of tokenizer.chatOptions whose switches are exactly those
 * given (apply_chat_template's keyword arguments, e.g. enable_thinking=False). Throws when `chat` is
 * asked of a manifest without a template, when an option is one the template has not (naming those
 * it has), or when an id is outside model.vocab (a tokenizer larger than the model's embedding).
 */
std::vector<int> text_prompt_ids(const Manifest& m, const Tokenizer& tok, const std::string& text, bool chat, const ChatOptions& options = {});

/**
 * The ids of a text prompt with an image: the image's block of ids (ImagePrompt::block: vision_start,
 * its image tokens, vision_end) before the text. Plain: text_prompt_ids(text) with the block before
 * it, after its BOS where the model has one (the ids forge's oracle traces: Qwen3-VL
 * `[vision_start] + [image]×T + [vision_end] + tok(text)`, Gemma 4 `[bos] + block + tok(text)[1:]`). chat: the
 * block inside the user turn, before the text: prefix, block, text + suffix, as HF's processor feeds
 * the template's `<|vision_start|><|image_pad|><|vision_end|>` (its image token expanded to T): each
 * is a special token, so tokenizing the pieces apart gives the ids of the whole.
 */
std::vector<int> image_prompt_ids(const Manifest& m, const Tokenizer& tok, const std::vector<int>& block, const std::string& text, bool chat,
                                  const ChatOptions& options = {});

/** Throws, naming the flag and entry, when an id is outside [0, model.vocab). */
void check_vocab(const Manifest& m, const std::vector<int>& ids, const std::string& what);

}  // namespace forge
