// gemma4_split_generate on the Gemma-4 twin's bundles (test/helpers/make-bundle.ts --gemma4): every
// token HF's in fp32 and W8 while prompts and continuations run past the sliding window (the ring
// caches wrap), image prompts included (the image read and encoded by the runtime); the ring mask
// and ring writes by themselves; the image prompt's ids as HF's; and the validator refusing, naming
// the field, what the host-op would not run.
#include <fstream>
#include <algorithm>
#include <cctype>
#include <functional>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bundle_env.h"
#include "gemma4_generate/gemma4_generate.h"
#include "manifest.h"
#include "prompt.h"
#include "step_buffers.h"
#include "tokenizer.h"

using nlohmann::json;
using forge_test::load;

namespace {

constexpr float kMasked = -65504.0f;

std::string error_of(const json& doc, const std::string& root) {
  try {
    forge::parse_manifest(doc, "manifest.json", root);
  } catch (const forge::ManifestError& e) {
    return e.what();
  }
  return "";
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

/** The ring width of the bundle's sliding caches (every windowed state has the same). */
int ring_of(const forge::Manifest& m) {
  int w = 0;
  for (const forge::StateSpec& s : m.state)
    if (s.window) w = *s.window;
  return w;
}

/** Greedy over a traced prompt; an image prompt's image read (as qhx_generate --image reads it) and encoded first. */
forge::GenerateResult run_traced(forge_test::Loaded& l, const forge_test::TracePrompt& tp) {
  if (!tp.image.empty()) l.gen->encode_image(forge::find_host_op(l.manifest.host_op)->image(l.manifest)(tp.image).pixels);
  return l.gen->generate(tp.prompt_tokens, {int(tp.generated.size()), true, true});
}

void expect_parity_past_the_window(const char* label, const std::string& bundle, const std::string& trace) {
  auto l = load(bundle);
  ASSERT_EQ(l->manifest.host_op, "gemma4_split_generate");
  const int ring = ring_of(l->manifest);
  ASSERT_GT(ring, 0) << "the bundle has no ring cache";
  ASSERT_LT(ring, l->manifest.max_context);
  auto prompts = forge_test::load_trace(trace);
  size_t longest = 0;
  for (const auto& tp : prompts) {
    auto r = run_traced(*l, tp);
    EXPECT_EQ(r.generated, tp.generated) << label << " '" << tp.text << "'" << (tp.image.empty() ? "" : " with " + tp.image);
    longest = std::max(longest, tp.prompt_tokens.size() + tp.generated.size());
    // A continuation alone longer than the window: the ring wraps while generating, not only in the prompt.
    EXPECT_GT(tp.generated.size(), size_t(ring)) << tp.text;
  }
  EXPECT_GT(longest, size_t(4 * ring)) << "no prompt wraps the ring several times";
}

}  // namespace

TEST(Gemma4, Fp32GreedyParityWithHFPastTheSlidingWindow) {
  NEED_ENV(bundle, "FORGE_TEST_GEMMA4_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_GEMMA4_TRACE");
  expect_parity_past_the_window("gemma4 fp32", bundle, trace);
}

TEST(Gemma4, W8GreedyParityWithHFPastTheSlidingWindow) {
  NEED_ENV(bundle, "FORGE_TEST_GEMMA4_BUNDLE_W8");
  NEED_ENV(trace, "FORGE_TEST_GEMMA4_TRACE");
  expect_parity_past_the_window("gemma4 w8", bundle, trace);
}

// Prefill hands decode the same caches as decoding over the prompt (the rings written N rows at
// a time, the donor caches read by the other context after the rows are written): the same tokens
// on the traced prompts (the image ones with their picture, its soft tokens across several chunks),
// one of 2N + 3 tokens and one of exactly 2N, in fp32 and W8.
void expect_prefill_equals_decode(const std::string& bundle, const std::string& trace) {
  auto l = load(bundle);
  ASSERT_TRUE(l->gen->has_prefill()) << "the tiny bundle is expected to have prefill graphs";
  int chunk = 0;
  for (const auto& c : l->manifest.contexts)
    if (const auto* g = c.graph(forge::role::prefill)) chunk = g->tokens;
  std::set<int> media;  // a synthetic prompt must not hold an image or audio token (no encoder output to put there)
  for (const char* key : {"image_token_id", "audio_token_id"})
    if (l->manifest.host_op_numbers.count(key)) media.insert(int(l->manifest.host_op_numbers.at(key)));
  auto prompts = forge_test::load_trace(trace);
  for (auto p : forge_test::prefill_test_prompts(trace, chunk, l->manifest.vocab)) {
    if (p.size() < size_t(2 * chunk)) continue;  // the traced ones are above
    for (int& id : p)
      if (media.count(id)) id = 1;
    forge_test::TracePrompt tp;
    tp.prompt_tokens = p;
    tp.text = "synthetic " + std::to_string(p.size());
    prompts.push_back(tp);
  }
  for (const auto& tp : prompts) {
    if (!tp.image.empty()) l->gen->encode_image(forge::find_host_op(l->manifest.host_op)->image(l->manifest)(tp.image).pixels);
    auto a = l->gen->generate(tp.prompt_tokens, {24, true, true});
    auto b = l->gen->generate(tp.prompt_tokens, {24, true, false});
    EXPECT_TRUE(a.used_prefill);
    EXPECT_FALSE(b.used_prefill);
    EXPECT_EQ(a.generated, b.generated) << "'" << tp.text << "' (" << tp.prompt_tokens.size() << " tokens)";
  }
}

TEST(Gemma4, PrefillEqualsDecodeOverPrompt) {
  NEED_ENV(bundle, "FORGE_TEST_GEMMA4_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_GEMMA4_TRACE");
  expect_prefill_equals_decode(bundle, trace);
}

TEST(Gemma4, W8PrefillEqualsDecodeOverPrompt) {
  NEED_ENV(bundle, "FORGE_TEST_GEMMA4_BUNDLE_W8");
  NEED_ENV(trace, "FORGE_TEST_GEMMA4_TRACE");
  expect_prefill_equals_decode(bundle, trace);
}

// HF's sliding rule: a key at q is seen from position p while p - q < window. In a ring of window
// slots, position q lives in slot q mod window; the new token's own column always shows.
TEST(RingMask, ShowsExactlyThePositionsInsideTheWindow) {
  const int W = 4;
  forge::StepMask mask(W, 1, kMasked, true);
  for (int p = 0; p < 11; p++) {
    mask.fill(p, 1);
    for (int slot = 0; slot < W; slot++) {
      // The position the slot holds before this token's row is written: the latest q < p with q mod W == slot.
      int q = p - 1 - ((p - 1 - slot) % W + W) % W;
      bool visible = q >= 0 && p - q < W;
      EXPECT_EQ(mask.data()[slot], visible ? 0.0f : kMasked) << "position " << p << " slot " << slot;
    }
    EXPECT_EQ(mask.data()[W], 0.0f);
  }
}

// Prefill: n rows at once over a ring of S + n - 1 slots. Each row sees exactly the positions HF's
// sliding rule shows it (q - p < S), and no slot a row sees is overwritten by the call's own rows:
// a later context reading the ring after this call's rows were written (a KV-shared layer whose
// donor is in an earlier context) finds what the mask opens.
TEST(RingMask, PrefillRowsSeeTheirWindowAndTheRingKeepsIt) {
  const int S = 4;
  for (int n : {1, 3, 4}) {
    const int C = S + n - 1;
    forge::StepMask mask(C, n, kMasked, true, S);
    for (int start = 0; start < 15; start += n)
      for (int valid : {n, 1}) {
        // The ring as the runtime writes it (StateRows::write): positions 0..start-1, then the call's rows.
        std::vector<int> held(size_t(C), -1);
        for (int q = 0; q < start; q++) held[size_t(q % C)] = q;
        std::vector<int> after = held;
        for (int k = 0; k < valid; k++) after[size_t((start + k) % C)] = start + k;
        mask.fill(start, valid);
        for (int r = 0; r < n; r++) {
          const float* row = mask.data() + size_t(r) * size_t(C + n);
          for (int slot = 0; slot < C; slot++) {
            const int p = held[size_t(slot)];
            const bool visible = p >= 0 && start + r - p < S;
            EXPECT_EQ(row[slot], visible ? 0.0f : kMasked) << "n " << n << " start " << start << " row " << r << " slot " << slot;
            // A context reading the ring after the call's rows were written finds what the row sees.
            if (visible) EXPECT_EQ(after[size_t(slot)], p) << "n " << n << " start " << start << " row " << r << " slot " << slot;
          }
          for (int k = 0; k < n; k++) EXPECT_EQ(row[C + k], k <= r && k < valid ? 0.0f : kMasked) << "n " << n << " start " << start << " row " << r << " new " << k;
        }
      }
  }
  EXPECT_THROW(forge::StepMask(4, 1, kMasked, true, 5), std::logic_error);
}

TEST(RingMask, RowsGoToTheirSlotModuloTheWindow) {
  forge::GraphOutput o;
  o.shape = {1, 2, 1, 3};  // two heads, one row of three
  o.axis = 2;
  o.state = 0;
  forge::StateRows rows(o);
  std::vector<float> cache(2 * 4 * 3, 0.0f);
  for (int p = 0; p < 6; p++) {
    for (size_t e = 0; e < rows.buf.size(); e++) rows.buf[e] = float(100 * p + int(e));
    rows.write(cache.data(), 4, 1, p, 1, true);
  }
  // Positions 4 and 5 overwrote slots 0 and 1; slots 2 and 3 still hold positions 2 and 3.
  const int expect_pos[4] = {4, 5, 2, 3};
  for (int h = 0; h < 2; h++)
    for (int s = 0; s < 4; s++) EXPECT_EQ(cache[size_t((h * 4 + s) * 3)], float(100 * expect_pos[s] + h * 3)) << "head " << h << " slot " << s;
}

TEST(Gemma4Manifest, ItsHostOpRulesHold) {
  NEED_ENV(bundle, "FORGE_TEST_GEMMA4_BUNDLE");
  const json good = read_json(bundle + "/manifest.json");
  ASSERT_EQ(error_of(good, bundle), "");
  // Find a graph reading a ring cache and its windowed mask, and a per-layer-rows input.
  std::string mask_at, rows_at;
  for (size_t c = 0; c < good["contexts"].size(); c++)
    for (size_t g = 0; g < good["contexts"][c]["graphs"].size(); g++)
      for (size_t i = 0; i < good["contexts"][c]["graphs"][g]["inputs"].size(); i++) {
        const json& in = good["contexts"][c]["graphs"][g]["inputs"][i];
        const std::string at = "/contexts/" + std::to_string(c) + "/graphs/" + std::to_string(g) + "/inputs/" + std::to_string(i);
        if (in["bind"] == "mask" && in.contains("window") && mask_at.empty()) mask_at = at;
        if (in["bind"] == "host-rows" && in.contains("layer") && rows_at.empty()) rows_at = at;
      }
  ASSERT_FALSE(mask_at.empty());
  ASSERT_FALSE(rows_at.empty());
  // The vision context and its positions input (int32).
  std::string vision_at, positions_at;
  for (size_t c = 0; c < good["contexts"].size(); c++)
    if (good["contexts"][c]["graphs"][0]["role"] == "vision") {
      vision_at = "/contexts/" + std::to_string(c) + "/graphs/0";
      for (size_t i = 0; i < good["contexts"][c]["graphs"][0]["inputs"].size(); i++)
        if (good["contexts"][c]["graphs"][0]["inputs"][i]["dtype"] == "int32") positions_at = vision_at + "/inputs/" + std::to_string(i);
    }
  ASSERT_FALSE(vision_at.empty()) << "the bundle has no vision graph";
  ASSERT_FALSE(positions_at.empty());
  auto path = [](std::string p) {  // "/contexts/0/graphs/0/inputs/3" → "contexts[0].graphs[0].inputs[3]"
    std::string out;
    for (size_t i = 1; i < p.size();) {
      size_t j = p.find('/', i);
      std::string part = p.substr(i, j == std::string::npos ? std::string::npos : j - i);
      out += std::isdigit(static_cast<unsigned char>(part[0])) ? "[" + part + "]" : (out.empty() ? "" : ".") + part;
      i = j == std::string::npos ? p.size() : j + 1;
    }
    return out;
  };
  struct Mutation {
    const char* what;
    std::function<void(json&)> apply;
    std::string expect;
  };
  const std::vector<Mutation> mutations = {
      {"no embed scale", [](json& j) { j["hostOpParams"].erase("embed_scale"); }, "hostOpParams.embed_scale: gemma4_split_generate needs a positive number here"},
      {"zero PLE scale", [](json& j) { j["hostOpParams"]["per_layer_embed_scale"] = 0; }, "hostOpParams.per_layer_embed_scale: gemma4_split_generate needs a positive number here"},
      {"ring read without its mask", [&](json& j) { j[json::json_pointer(mask_at)].erase("window"); }, path(mask_at)},
      // The first ring mask is shard0's prefill graph's (16 tokens, a ring of 16 + 16 - 1 slots).
      {"a window wider than its ring", [&](json& j) { j[json::json_pointer(mask_at)]["sliding"] = 32; }, path(mask_at) + ".sliding: 32 is wider than the ring's 31 slots"},
      {"a ring too short for the prefill rows", [&](json& j) { j[json::json_pointer(mask_at)]["sliding"] = 31; },
       path(mask_at) + ".window: a ring of 31 slots under a 31-position window cannot take 16 tokens per call: it needs window + tokens - 1 = 46"},
      {"per-layer rows without a layer", [&](json& j) { j[json::json_pointer(rows_at)].erase("layer"); }, path(rows_at) + ".layer: per-layer-embedding rows need the layer whose slice they are"},
      {"the bundle under decoder_generate", [](json& j) { j["hostOp"] = "decoder_generate"; }, "decoder_generate has no ring caches"},
      {"no pad token", [](json& j) { j["hostOpParams"].erase("pad_token_id"); }, "hostOpParams.pad_token_id: gemma4_split_generate needs an integer here"},
      {"an image token past the vocabulary", [](json& j) { j["hostOpParams"]["image_token_id"] = j["model"]["vocab"]; }, "hostOpParams.image_token_id: "},
      {"a budget HF does not have", [](json& j) { j["hostOpParams"]["max_soft_tokens"] = 71; }, "hostOpParams: gemma4 image spec: "},
      {"positions as float32", [&](json& j) { j[json::json_pointer(positions_at)]["dtype"] = "float32"; }, "must be [630,768] (3 · patch² values per patch)"},
      {"soft tokens of another width", [&](json& j) { j[json::json_pointer(vision_at)]["outputs"][0]["shape"] = {70, 7}; }, "must be [max_soft_tokens, model.hidden]"},
      {"a prefill graph", [](json& j) { j["contexts"][0]["graphs"][0]["role"] = "prefill"; j["contexts"][0]["graphs"][0]["tokens"] = 2; }, ""},
  };
  for (const Mutation& mu : mutations) {
    json doc = good;
    mu.apply(doc);
    std::string err = error_of(doc, bundle);
    EXPECT_NE(err, "") << mu.what << ": accepted";
    EXPECT_NE(err.find(mu.expect), std::string::npos) << mu.what << ": expected '" << mu.expect << "', got '" << err << "'";
  }
}

// The residual hand-off in f16 (recipe `handoff: auto`, chosen by the oracle gate on the twin): every
// residual one context gives another is f16, and the validator holds them to one dtype.
TEST(Gemma4, TheShippedBundleHandsTheResidualOverInF16) {
  NEED_ENV(bundle, "FORGE_TEST_GEMMA4_BUNDLE_W8");
  const json doc = read_json(bundle + "/manifest.json");
  ASSERT_EQ(doc["contexts"][0]["graphs"][0]["role"], "vision");  // the twin's recipe reads images
  int residuals = 0;
  std::string first_at;
  for (size_t c = 0; c < doc["contexts"].size(); c++)
    for (size_t g = 0; g < doc["contexts"][c]["graphs"].size(); g++)
      for (const char* side : {"inputs", "outputs"})
        for (size_t i = 0; i < doc["contexts"][c]["graphs"][g][side].size(); i++) {
          const json& t = doc["contexts"][c]["graphs"][g][side][i];
          if (t["bind"] != "residual") continue;
          residuals++;
          // The first shard's input (the context after the vision encoder's) is the host's scaled
          // embedding row in float32, not a hand-off.
          if (c == 1 && std::string(side) == "inputs") {
            EXPECT_EQ(t["dtype"], "float32") << t["name"];
            continue;
          }
          EXPECT_EQ(t["dtype"], "float16") << t["name"];
          if (first_at.empty()) first_at = "/contexts/" + std::to_string(c) + "/graphs/" + std::to_string(g) + "/" + side + "/" + std::to_string(i);
        }
  // shard0's input and output and shard1's, in its prefill and decode graphs; the lm-head's input.
  EXPECT_EQ(residuals, 9);
  json mixed = doc;
  mixed[json::json_pointer(first_at)]["dtype"] = "float32";
  const std::string err = error_of(mixed, bundle);
  EXPECT_NE(err.find("every residual hand-off has one dtype"), std::string::npos) << err;
}

// An image prompt as the runtime makes it: the processor's soft-token count for the image's aspect
// ratio, the block after the BOS, the text's ids after it — the ids HF traced; each of the traced
// images gives its own continuation, HF's (in fp32 free-running over every traced token).
TEST(Gemma4Image, ThePromptIsHFsAndEachImageItsOwnAnswer) {
  NEED_ENV(bundle, "FORGE_TEST_GEMMA4_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_GEMMA4_TRACE");
  auto l = load(bundle);
  const forge::Tokenizer tok = forge::Tokenizer::from_file(bundle + "/tokenizer.json");
  const forge::ImageReader read = forge::find_host_op("gemma4_split_generate")->image(l->manifest);
  std::vector<std::vector<int>> answers;
  for (const auto& tp : forge_test::load_trace(trace)) {
    if (tp.image.empty()) continue;
    const forge::ImagePrompt p = read(tp.image);
    EXPECT_EQ(p.block.size(), size_t(p.tokens) + 2);
    EXPECT_EQ(forge::image_prompt_ids(l->manifest, tok, p.block, tp.text, false), tp.prompt_tokens) << tp.image;
    l->gen->encode_image(p.pixels);
    const auto r = l->gen->generate(tp.prompt_tokens, {int(tp.generated.size()), true, true});
    EXPECT_EQ(r.generated, tp.generated) << tp.image;
    answers.push_back(r.generated);
  }
  ASSERT_EQ(answers.size(), 2u) << "the trace has two image prompts";
  EXPECT_NE(answers[0].front(), answers[1].front()) << "the two images begin the same answer";
}

TEST(Gemma4Image, RefusesImageTokensItCannotFeed) {
  NEED_ENV(bundle, "FORGE_TEST_GEMMA4_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_GEMMA4_TRACE");
  forge_test::TracePrompt image;
  for (const auto& tp : forge_test::load_trace(trace))
    if (!tp.image.empty() && image.image.empty()) image = tp;
  ASSERT_FALSE(image.image.empty());
  auto l = load(bundle);
  auto refused = [&](const std::vector<int>& ids, const std::string& want) {
    try {
      l->gen->generate(ids, {2, true, true});
      ADD_FAILURE() << "ran: " << want;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused(image.prompt_tokens, "no image was given to the encoder");
  const forge::ImagePrompt p = forge::find_host_op("gemma4_split_generate")->image(l->manifest)(image.image);
  l->gen->encode_image(p.pixels);
  std::vector<int> longer = image.prompt_tokens;
  longer.insert(longer.begin() + 2, p.image_token);
  refused(longer, "image tokens (id " + std::to_string(p.image_token) + "); the encoded image has " + std::to_string(p.tokens) + " soft tokens");
  std::vector<int> two = image.prompt_tokens;
  two.insert(two.end(), p.block.begin(), p.block.end());
  refused(two, "more than one run of image tokens");
}

// The bundle's text manifest (no vision graph) runs text as the vision manifest does and reads no image.
TEST(Gemma4Image, TheTextManifestRunsTextAndReadsNoImage) {
  NEED_ENV(bundle, "FORGE_TEST_GEMMA4_BUNDLE");
  NEED_ENV(trace, "FORGE_TEST_GEMMA4_TRACE");
  forge::Manifest text = forge::load_manifest(bundle + "/manifest.text.json", bundle);
  EXPECT_EQ(forge::gemma4_encoder_graph(text, "vision"), nullptr);
  forge::Executor exec(text, {});
  auto gen = forge::make_generator(text, exec);
  for (const auto& tp : forge_test::load_trace(trace))
    if (tp.image.empty()) EXPECT_EQ(gen->generate(tp.prompt_tokens, {int(tp.generated.size()), true, true}).generated, tp.generated) << tp.text;
  try {
    forge::find_host_op("gemma4_split_generate")->image(text);
    ADD_FAILURE() << "a text manifest gave an image reader";
  } catch (const forge::ManifestError& e) {
    EXPECT_NE(std::string(e.what()).find("contexts: no vision graph (role vision): this manifest reads no image"), std::string::npos) << e.what();
  }
}

// Gemma4Processor's audio token count: the frame mask through two kernel-3, stride-2, pad-1 convs
// (output t reads frame 2t), counted. The twin's clips at a 2 s budget (199 frames): 1.2 s = 119 valid
// frames → 30 tokens, 0.7 s = 69 → 18 (what HF's processor wrote into the traced prompts).
TEST(Gemma4Audio, TokenCountIsTheProcessors) {
  auto mask = [](int frames, int valid) {
    std::vector<uint8_t> m(size_t(frames), 0);
    std::fill(m.begin(), m.begin() + valid, uint8_t(1));
    return m;
  };
  EXPECT_EQ(forge::gemma4_audio_tokens(mask(199, 119)), 30);
  EXPECT_EQ(forge::gemma4_audio_tokens(mask(199, 69)), 18);
  EXPECT_EQ(forge::gemma4_audio_tokens(mask(2999, 2999)), 750);  // 30 s: HF's audio_seq_length
  EXPECT_EQ(forge::gemma4_audio_tokens(mask(8, 1)), 1);
  EXPECT_EQ(forge::gemma4_audio_tokens(mask(8, 0)), 0);
}
