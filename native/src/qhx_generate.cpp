// qhx_generate <manifest> <backend-lib> <system-lib> <artifacts_root> <max_new_tokens> (<prompt> | --prompt-ids 1,2,3)
//              [--image FILE | --audio FILE] [--chat [--chat-option NAME=true|false]...] [--json] [--ignore-eos] [--no-prefill] [--verify] [--force-ids 5,6,7] [--print-prompt-ids]
// Runs a forge bundle greedily with the host-op its manifest names (the registry, host_op.h).
// backend-lib is `cpu` (CPU EP on the ONNX graphs) or the path of a QNN backend library (QNN EP
// plugin on the compiled contexts); system-lib is libQnnSystem.so or `-`.
// The prompt is text, always (the text "42" is tokenized); token ids go with --prompt-ids instead of
// the prompt, each checked against the vocabulary. --chat wraps the text in the model's chat template
// (one user turn and the assistant's generation prompt, as forge rendered it into tokenizer.chat) and
// adds no BOS: the ids transformers' apply_chat_template gives. --chat-option NAME=true|false
// (repeatable, with --chat) passes a switch the template reads, as apply_chat_template(NAME=...) does
// (Qwen3: enable_thinking=false): the wrap forge rendered for that combination (tokenizer.chatOptions);
// a switch the bundle's template has not is refused, naming those it has. --print-prompt-ids prints the prompt's
// ids and stops before the graphs load (feed them back with --prompt-ids for an exact-id repro).
// --force-ids teacher-forces the continuation: step k
// (k >= 1) is fed the k-th forced id instead of the token chosen at step k - 1 (at most max_new_tokens
// ids, each in the vocabulary), and generated_ids is still the token the runtime chose at every step;
// the parity gate forces HF's greedy tokens so a comparison goes on past a mismatch. The text and EOS
// stop follow the sequence as fed.
// --image FILE (a host-op that reads an image: qwen3_vl_generate, gemma4_split_generate, with their
// vision manifest): the file is pre-processed as hostOpParams say (image_input.h, gemma4_image.h),
// the vision graph runs once, and the prompt is the image's block (its start token, its T image
// tokens, its end token; Gemma 4's T depends on the image's aspect ratio) then the text's ids, after
// the BOS where the model has one; with --chat the block opens the user turn (prefix + block + text +
// suffix). With --prompt-ids the ids are fed as given and must hold the image's T image tokens.
// --audio FILE (gemma4_split_generate with its audio graph): likewise for a clip (WAV, FLAC, OGG:
// audio_input.h's log-mel features, HF's Gemma 4 feature extractor), its block <start_of_audio>, T
// audio tokens, <end_of_audio>; one image or one clip per prompt.
// Prints the generated ids and text; --json prints one JSON object instead:
//   {prompt_ids, generated_ids, text (null when it cannot be had), text_error (why, else null),
//    stopped_at_eos, prefill, backend, verified,
//    timings: {load_ms, prefill_ms, decode_ms_per_token, host_overhead_ms_per_token, decode_steps},
//    weights: {mapped_files, mapped_bytes, shared_tensors, shared_tensor_uses} (CPU: weights mapped once, shared by the graphs),
//    memory: {rss_anon_bytes, rss_file_bytes, vm_hwm_bytes} (this process, at the end; -1 where /proc has none)
//    [, image: {file, tokens, decode_ms, resize_ms, patchify_ms, vision_ms} with --image (pre-processing not in load_ms)]
//    [, audio: {file, tokens, frames, decode_ms, resample_ms, features_ms, audio_ms} with --audio]}
// At load every file must exist with the manifest's size, and every file's sha256 must match, except
// the big context binaries and embedding table (sizes only): hashing those is most of start-up.
// --verify hashes them too (once after a push; `sha256sum -c SHA256SUMS` does the same).
// Any error: one line on stderr, exit status 1; 3 when the logits to take the argmax of held NaN/Inf.
// Environment: FORGE_ORT_THREADS (intra-op threads), FORGE_ORT_LOG (ORT's own log level), FORGE_QNN_EP_LIB (the QNN EP plugin library).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "executor.h"
#include "image_input.h"
#include "host_op.h"
#include "manifest.h"
#include "prompt.h"
#include "tokenizer.h"

namespace {

const char* kUsage =
    "usage: qhx_generate <manifest> <backend-lib|cpu> <system-lib|-> <artifacts_root> <max_new_tokens> "
    "(<prompt text> | --prompt-ids 1,2,3) [--image FILE | --audio FILE] [--chat [--chat-option NAME=true|false]...] [--json] [--ignore-eos] [--no-prefill] [--verify] [--force-ids 5,6,7] [--print-prompt-ids]";

std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); i++) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

/**
 * The manifest's reader of a medium (`get` picks HostOpSpec::image or ::audio), or one error: the
 * host-op reads no such medium (naming those that do), or this manifest carries no encoder for it.
 */
template <typename Get>
auto media_reader(const forge::Manifest& m, const std::string& flag, const std::string& what, Get get) {
  const forge::HostOpSpec* op = forge::find_host_op(m.host_op);
  if (!get(*op)) {
    std::string readers;
    for (const std::string& n : forge::host_op_names())
      if (get(*forge::find_host_op(n))) readers += (readers.empty() ? "" : ", ") + n;
    throw std::runtime_error(flag + ": hostOp " + m.host_op + " reads no " + what + " (a host-op that does: " + readers + ")");
  }
  try {
    return get(*op)(m);
  } catch (const forge::ManifestError& e) {
    throw std::runtime_error(flag + ": " + e.what());
  }
}

int run(int argc, char** argv) {
  std::vector<std::string> pos;
  std::optional<std::string> prompt_ids, force_ids, image, audio;
  bool as_json = false, ignore_eos = false, no_prefill = false, verify_all = false, chat = false, print_prompt_ids = false;
  forge::ChatOptions chat_options;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--prompt-ids") {
      if (i + 1 >= argc) throw std::runtime_error("--prompt-ids needs a value: token ids like 1,2,3");
      if (prompt_ids) throw std::runtime_error("--prompt-ids given twice");
      prompt_ids = argv[++i];
    } else if (a == "--force-ids") {
      if (i + 1 >= argc) throw std::runtime_error("--force-ids needs a value: the token ids to continue with, like 5,6,7");
      if (force_ids) throw std::runtime_error("--force-ids given twice");
      force_ids = argv[++i];
    } else if (a == "--audio") {
      if (i + 1 >= argc) throw std::runtime_error("--audio needs a value: an audio file (WAV, FLAC, OGG)");
      if (audio) throw std::runtime_error("--audio given twice: a prompt takes one clip");
      audio = argv[++i];
    } else if (a == "--image") {
      if (i + 1 >= argc) throw std::runtime_error("--image needs a value: an image file (JPEG or PNG)");
      if (image) throw std::runtime_error("--image given twice: a prompt takes one image");
      image = argv[++i];
    } else if (a == "--chat-option") {
      if (i + 1 >= argc) throw std::runtime_error("--chat-option needs a value: a switch of the chat template, like enable_thinking=false");
      forge::add_chat_option(chat_options, argv[++i]);
    } else if (a == "--ids") throw std::runtime_error("--ids is gone: give token ids as --prompt-ids 1,2,3 in place of the prompt");
    else if (a == "--chat") chat = true;
    else if (a == "--print-prompt-ids") print_prompt_ids = true;
    else if (a == "--json") as_json = true;
    else if (a == "--ignore-eos") ignore_eos = true;
    else if (a == "--no-prefill") no_prefill = true;
    else if (a == "--verify") verify_all = true;
    else if (a == "--help" || a == "-h") { std::cout << kUsage << "\n"; return 0; }
    else if (a.rfind("--", 0) == 0 && pos.size() != 5) throw std::runtime_error("unknown option " + a + "; " + kUsage);
    else pos.push_back(a);
  }
  if (prompt_ids && pos.size() == 6) throw std::runtime_error("give the prompt as text or as --prompt-ids, not both; " + std::string(kUsage));
  if (pos.size() != (prompt_ids ? 5u : 6u)) throw std::runtime_error(kUsage);
  if (!chat_options.empty() && !chat) throw std::runtime_error("--chat-option sets a switch of the chat template: it needs --chat");
  if (chat && prompt_ids) throw std::runtime_error("--chat wraps a text prompt in the chat template; --prompt-ids are fed as given, not both");
  const std::string &manifest_path = pos[0], &backend = pos[1], &system_lib = pos[2], &root = pos[3];
  int max_new = 0;
  try {
    size_t used;
    max_new = std::stoi(pos[4], &used);
    if (used != pos[4].size() || max_new < 1) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw std::runtime_error("max_new_tokens '" + pos[4] + "' is not a positive integer");
  }
  std::vector<int> forced;
  if (force_ids) {
    forced = forge::parse_ids(*force_ids, "--force-ids");
    if (forced.size() > size_t(max_new))
      throw std::runtime_error("--force-ids: " + std::to_string(forced.size()) + " ids for max_new_tokens " + std::to_string(max_new) +
                               ": at most one forced id per generated token");
  }

  const auto t_load = std::chrono::steady_clock::now();
  forge::Manifest m = forge::load_manifest(manifest_path, root, forge::LoadOptions{verify_all ? forge::Verify::all : forge::Verify::small});
  std::optional<forge::Tokenizer> tok;
  std::string tok_error;
  try {
    tok.emplace(forge::Tokenizer::from_file(m.resolve(m.tokenizer_file)));
  } catch (const std::exception& e) {
    tok_error = e.what();
  }
  // An image or a clip: its host-op's reader (from the manifest alone) pre-processes it and gives
  // the prompt's block for it. Timed on its own, not as part of load_ms.
  if (image && audio) throw std::runtime_error("--audio with --image: a prompt takes one image or one audio clip");
  std::optional<forge::ImagePrompt> image_prompt;
  std::optional<forge::AudioPrompt> audio_prompt;
  const auto t_media = std::chrono::steady_clock::now();
  if (image) image_prompt = media_reader(m, "--image", "image", [](const forge::HostOpSpec& h) { return h.image; })(*image);
  if (audio) audio_prompt = media_reader(m, "--audio", "audio", [](const forge::HostOpSpec& h) { return h.audio; })(*audio);
  const double preprocess_ms = image || audio ? std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_media).count() : 0;
  // The medium's block and token, whichever was given.
  const std::vector<int>* block = image_prompt ? &image_prompt->block : audio_prompt ? &audio_prompt->block : nullptr;
  const int media_token = image_prompt ? image_prompt->image_token : audio_prompt ? audio_prompt->audio_token : -1;
  const int media_tokens = image_prompt ? image_prompt->tokens : audio_prompt ? audio_prompt->tokens : 0;
  const char* medium = image_prompt ? "image" : "audio";
  std::vector<int> ids;
  if (prompt_ids) {
    ids = forge::parse_ids(*prompt_ids);
    forge::check_vocab(m, ids, "--prompt-ids");
    if (block) {
      const auto n = std::count(ids.begin(), ids.end(), media_token);
      if (n != media_tokens)
        throw std::runtime_error(std::string("--prompt-ids with --") + medium + ": the ids hold " + std::to_string(n) + " " + medium + " tokens (id " +
                                 std::to_string(media_token) + "), the " + (image_prompt ? "image" : "clip") + " is " + std::to_string(media_tokens) + " tokens");
    }
  } else {
    if (!tok) throw std::runtime_error(tok_error);
    ids = block ? forge::image_prompt_ids(m, *tok, *block, pos[5], chat, chat_options) : forge::text_prompt_ids(m, *tok, pos[5], chat, chat_options);
  }
  forge::check_vocab(m, forced, "--force-ids");
  if (print_prompt_ids) {  // what the model would be fed; nothing is loaded or run
    if (as_json) std::cout << nlohmann::json{{"prompt_ids", ids}}.dump() << "\n";
    else std::cout << "prompt_ids: " << join_ids(ids) << "\n";
    return 0;
  }
  const forge::Pixels* pixels = image_prompt ? &image_prompt->pixels : nullptr;

  // FORGE_ORT_THREADS pins ORT's intra-op threads (timings of tiny graphs are noisy with spinning pools).
  const char* threads = std::getenv("FORGE_ORT_THREADS");
  forge::Executor exec(m, forge::ExecutorOptions{backend, system_lib, threads ? std::atoi(threads) : 0});
  // The manifest's host-op, from the registry (load_manifest has run its validator).
  std::unique_ptr<forge::Generator> gen = forge::make_generator(m, exec);
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count() - preprocess_ms;
  // The encoder runs once, before the prompt.
  const double vision_ms = pixels ? gen->encode_image(*pixels) : 0;
  const double audio_ms = audio_prompt ? gen->encode_audio(audio_prompt->features) : 0;
  forge::GenerateResult r = gen->generate(ids, forge::GenerateOptions{max_new, ignore_eos, !no_prefill}, forced);
  // The ids are the result; the text is a convenience. A model whose vocabulary is larger than its
  // tokenizer's (padded embeddings; forge's synthetic 4B checkpoints carry the tiny twin's
  // tokenizer) can generate an id the tokenizer has no text for: the text is then null, not an error.
  std::optional<std::string> text;
  if (tok) {
    try {
      // The text of the sequence as it went on: forced ids where given, the runtime's own after.
      std::vector<int> sequence = r.generated;
      for (size_t k = 0; k < forced.size() && k < sequence.size(); k++) sequence[k] = forced[k];
      text = tok->decode(sequence);
    } catch (const std::runtime_error& e) {
      tok_error = std::string("generated ids not decodable: ") + e.what();
    }
  }

  if (as_json) {
    const forge::ProcessMemory mem = forge::process_memory();  // at the end of the run
    nlohmann::json out{
        {"prompt_ids", ids},
        {"generated_ids", r.generated},
        {"text", text ? nlohmann::json(*text) : nlohmann::json(nullptr)},
        {"text_error", text ? nlohmann::json(nullptr) : nlohmann::json(tok_error)},
        {"stopped_at_eos", r.stopped_at_eos},
        {"prefill", r.used_prefill},
        {"backend", exec.on_qnn() ? "qnn" : "cpu"},
        {"verified", verify_all ? "all" : "small files, sizes of the rest"},
        {"timings",
         {{"load_ms", load_ms},
          {"prefill_ms", r.timings.prefill_ms},
          {"decode_ms_per_token", r.timings.decode_ms_per_token},
          {"host_overhead_ms_per_token", r.timings.host_overhead_ms_per_token},
          {"decode_steps", r.timings.decode_steps}}},
        {"weights",
         {{"mapped_files", exec.shared_weights().files},
          {"mapped_bytes", exec.shared_weights().file_bytes},
          {"shared_tensors", exec.shared_weights().tensors},
          {"shared_tensor_uses", exec.shared_weights().uses}}},
        {"memory", {{"rss_anon_bytes", mem.anon}, {"rss_file_bytes", mem.file}, {"vm_hwm_bytes", mem.hwm}}}};
    if (pixels)
      out["image"] = {{"file", *image},          {"tokens", image_prompt->tokens},     {"decode_ms", pixels->decode_ms},
                      {"resize_ms", pixels->resize_ms}, {"patchify_ms", pixels->patchify_ms}, {"vision_ms", vision_ms}};
    if (audio_prompt) {
      const forge::AudioFeatures& f = audio_prompt->features;
      out["audio"] = {{"file", *audio}, {"tokens", audio_prompt->tokens}, {"frames", f.frames}, {"decode_ms", f.decode_ms},
                      {"resample_ms", f.resample_ms}, {"features_ms", f.features_ms}, {"audio_ms", audio_ms}};
    }
    // Generated text can hold U+FFFD from a split UTF-8 sequence: dump replaces, never throws.
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << "prompt_ids: " << join_ids(ids) << "\n";
    std::cout << "generated_ids: " << join_ids(r.generated) << "\n";
    std::cout << "text: " << (text ? *text : "(" + std::string(tok ? "" : "no tokenizer: ") + tok_error + ")") << "\n";
    if (pixels)
      std::printf("image: %d tokens  decode_ms: %.3f  resize_ms: %.3f  patchify_ms: %.3f  vision_ms: %.3f\n", image_prompt->tokens, pixels->decode_ms,
                  pixels->resize_ms, pixels->patchify_ms, vision_ms);
    if (audio_prompt)
      std::printf("audio: %d tokens  decode_ms: %.3f  resample_ms: %.3f  features_ms: %.3f  audio_ms: %.3f\n", audio_prompt->tokens, audio_prompt->features.decode_ms,
                  audio_prompt->features.resample_ms, audio_prompt->features.features_ms, audio_ms);
    std::printf("load_ms: %.1f  prefill_ms: %.3f  decode_ms_per_token: %.3f  host_overhead_ms_per_token: %.3f\n", load_ms, r.timings.prefill_ms,
                r.timings.decode_ms_per_token, r.timings.host_overhead_ms_per_token);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const forge::NonFiniteLogits& e) {
    std::fprintf(stderr, "qhx_generate: %s\n", e.what());
    return forge::kExitNonFiniteLogits;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    for (char& c : msg)
      if (c == '\n') c = ' ';
    std::fprintf(stderr, "qhx_generate: %s\n", msg.c_str());
    return 1;
  }
}
