// The host-op registry. A host-op is the host program that runs a bundle's graphs (the decode
// loop, routing, hand-offs between components); the manifest names it in `hostOp`. Each is
// registered by name with
//   validate: its manifest rules, run by load_manifest after the generic ones, refusing (with the
//             field path, through Manifest::fail) every binding, role, state or table it would not
//             execute, so nothing in a bundle is silently ignored;
//   make:     its factory, called once the manifest has passed both;
//   image:    for a host-op that reads an image, its pre-processing and prompt block (else nullptr);
//   audio:    for a host-op that reads an audio clip, likewise (else nullptr);
//   runs_without_encoder: whether its encoder-output inputs may name a component the manifest
//             leaves out (the host-op feeds zeros; the loader refuses such an input otherwise).
// qhx_generate dispatches through find_host_op; the list of built-in host-ops is in host_ops.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "audio_input.h"
#include "image_input.h"
#include "manifest.h"

namespace forge {

class Executor;

struct GenerateOptions {
  int max_new_tokens = 0;
  bool ignore_eos = false;
  bool use_prefill = true;
};

struct GenerateTimings {
  double prefill_ms = 0;                  // the whole prompt, through the first token's argmax
  double decode_ms_per_token = 0;         // one decode step, from token in to argmax out
  double host_overhead_ms_per_token = 0;  // the part of a decode step outside session Run calls
  int decode_steps = 0;
};

struct GenerateResult {
  std::vector<int> generated;
  bool stopped_at_eos = false;
  bool used_prefill = false;
  GenerateTimings timings;
};

/** Count of NaN/±Inf among x[0..n) and the index of the first (-1 when all are finite). */
struct NonFiniteCount {
  int64_t count = 0;
  int64_t first = -1;
};
NonFiniteCount count_non_finite(const float* x, int64_t n);

/**
 * The logits generate() would take the argmax of hold NaN/Inf: an argmax over them means nothing
 * (NaN never compares greater, so it would quietly give token 0). qhx_generate exits with
 * kExitNonFiniteLogits on it, so the parity gate can report it as what it is.
 */
class NonFiniteLogits : public std::runtime_error {
 public:
  NonFiniteLogits(int position, int token_index, NonFiniteCount nf, int vocab);
  int position, token_index;
};
constexpr int kExitNonFiniteLogits = 3;

/** What a host-op's factory gives: greedy generation over the bundle. */
class Generator {
 public:
  virtual ~Generator() = default;
  /**
   * `forced` teacher-forces the continuation: step k (k >= 1) is fed forced[k - 1] instead of the
   * token the runtime chose at step k - 1; past the last forced id the runtime goes on from its own
   * choices. GenerateResult::generated stays what the runtime chose at each step, so a parity gate can
   * compare every step with HF's token while the sequence follows HF's (at most max_new_tokens ids).
   */
  virtual GenerateResult generate(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced = {}) = 0;
  /** Whether a batched prefill is there to run (else the prompt is decoded token by token). */
  virtual bool has_prefill() const = 0;
  /**
   * Runs the host-op's image encoder over pre-processed pixels (HostOpSpec::image's reader makes
   * them) for the generate() calls after it, whose prompt then holds the image's tokens: they take
   * its rows. Returns the encoder's wall milliseconds. A host-op without an image encoder refuses.
   */
  virtual double encode_image(const Pixels& pixels);
  /** As encode_image, for an audio clip's features (HostOpSpec::audio's reader makes them). */
  virtual double encode_audio(const AudioFeatures& features);
};

/** An image made ready for a host-op: its encoder's input and the block of prompt ids that stands for it. */
struct ImagePrompt {
  Pixels pixels;
  /** The image's block of prompt ids (Qwen3-VL: vision_start, one image token per encoder output row, vision_end). */
  std::vector<int> block;
  int image_token = -1;  // the id of an image token
  int tokens = 0;        // image tokens in the block (rows of the encoder's output the prompt takes)
};
/**
 * Reads an image file as a manifest's host-op wants it: pre-processing and prompt block (the block
 * can depend on the image: Gemma 4 keeps its aspect ratio within a soft-token budget). Throws
 * std::runtime_error naming the file.
 */
using ImageReader = std::function<ImagePrompt(const std::string& path)>;

/** An audio clip made ready for a host-op: its encoder's input (padded to the encoder's frames) and its block of prompt ids. */
struct AudioPrompt {
  AudioFeatures features;
  std::vector<int> block;  // Gemma 4: <start_of_audio>, one audio token per soft token, <end_of_audio>
  int audio_token = -1;
  int tokens = 0;
};
/** Reads an audio file as a manifest's host-op wants it. Throws std::runtime_error naming the file. */
using AudioReader = std::function<AudioPrompt(const std::string& path)>;

struct HostOpSpec {
  const char* name;
  void (*validate)(const Manifest& m);
  std::unique_ptr<Generator> (*make)(const Manifest& m, Executor& exec);
  /**
   * nullptr: the host-op reads no image. Else the image reader of a manifest (qhx_generate --image),
   * made from the manifest alone (no graph is loaded); throws ManifestError when this manifest carries
   * no image encoder (a text manifest of a vision bundle).
   */
  ImageReader (*image)(const Manifest& m);
  /** As image, for an audio clip (qhx_generate --audio); nullptr: the host-op reads no audio. */
  AudioReader (*audio)(const Manifest& m);
  /**
   * An encoder-output input whose component the manifest does not carry is fed by the host-op
   * (zeros) instead of refused by the loader: a text manifest of a vision bundle over the same graphs.
   */
  bool runs_without_encoder;
};

/** The registered host-op of this name, or nullptr. */
const HostOpSpec* find_host_op(const std::string& name);
/** Every registered name, in registration order. */
std::vector<std::string> host_op_names();
/** A whole number in hostOpParams, at least `min`, or the refusal naming it (for host-op validators). */
int host_op_integer(const Manifest& m, const std::string& key, int min);
/** The generator of the manifest's host-op (load_manifest has refused an unregistered one). */
std::unique_ptr<Generator> make_generator(const Manifest& m, Executor& exec);

}  // namespace forge
