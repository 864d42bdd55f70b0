// qwen3_vl_generate: the multimodal RoPE positions against HF's get_rope_index, the validator's
// refusals (each naming its field), and end-to-end generation on the tiny Qwen3-VL bundles
// (FORGE_TEST_VL_BUNDLE, FORGE_TEST_VL_BUNDLE_W8: make-bundle keys `vl`, `vlW8`): an image prompt
// batched and token by token, an image across a prefill chunk boundary, two images, the bundle's
// text manifest (its vision context left out), the refusals of generate() and qhx_generate --image.
// Token equality with HF is native/tools/vl_reference.py's (README, "qwen3_vl_generate").
#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <png.h>

#include "bundle_env.h"
#include "host_op.h"
#include "image_input.h"
#include "manifest.h"
#include "prompt.h"
#include "qwen3_vl_generate/qwen3_vl_generate.h"
#include "tokenizer.h"

using nlohmann::json;

namespace {

using Rows = std::vector<std::vector<int>>;  // t, h, w rows

Rows rows_of(const forge::MropePlan& p) {
  Rows r(3);
  for (const auto& x : p.rows)
    for (int a = 0; a < 3; a++) r[size_t(a)].push_back(x[size_t(a)]);
  return r;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::string error_of(const json& doc, const std::string& root) {
  try {
    forge::parse_manifest(doc, "manifest.json", root, {forge::Verify::none});
  } catch (const forge::ManifestError& e) {
    return e.what();
  }
  return "";
}

/** The context (and its index) holding a graph of this name. */
int context_index(const json& doc, const std::string& context) {
  for (size_t i = 0; i < doc["contexts"].size(); i++)
    if (doc["contexts"][i]["name"] == context) return int(i);
  ADD_FAILURE() << "no context " << context;
  return 0;
}

/** The manifest with its vision context left out: the bundle's text manifest over the same graphs. */
json text_manifest(json doc) {
  json& cs = doc["contexts"];
  for (size_t i = 0; i < cs.size(); i++)
    if (cs[i]["graphs"][0]["role"] == "vision") {
      cs.erase(i);
      break;
    }
  return doc;
}

/** An 8-bit RGB PNG of w × h whose pixels are f(x, y). */
void write_png(const std::string& path, int w, int h, const std::function<std::array<uint8_t, 3>(int, int)>& f) {
  std::vector<uint8_t> rgb(size_t(w) * size_t(h) * 3);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      auto p = f(x, y);
      for (int c = 0; c < 3; c++) rgb[(size_t(y) * size_t(w) + size_t(x)) * 3 + size_t(c)] = p[size_t(c)];
    }
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = png_uint_32(w);
  img.height = png_uint_32(h);
  img.format = PNG_FORMAT_RGB;
  ASSERT_TRUE(png_image_write_to_file(&img, path.c_str(), 0, rgb.data(), 0, nullptr)) << img.message;
}

/** Two different pictures: 200 × 150 stripes and a disc (not the recipe's 128 × 96), and a 128 × 96 checkerboard. */
std::vector<std::string> test_images() {
  const std::string a = testing::TempDir() + "/vl-stripes.png", b = testing::TempDir() + "/vl-checker.png";
  write_png(a, 200, 150, [](int x, int y) -> std::array<uint8_t, 3> {
    if ((x - 105) * (x - 105) + (y - 75) * (y - 75) < 45 * 45) return {20, 40, 200};
    return (x / 10) % 2 ? std::array<uint8_t, 3>{uint8_t(x), uint8_t(255 - x), uint8_t((x * 3) % 256)} : std::array<uint8_t, 3>{255, 255, 255};
  });
  write_png(b, 128, 96, [](int x, int y) -> std::array<uint8_t, 3> {
    return (x / 16 + y / 16) % 2 ? std::array<uint8_t, 3>{250, 200, 30} : std::array<uint8_t, 3>{0, 0, 0};
  });
  return {a, b};
}

const char* kText = "Describe the image.";
const char* kLongText =
    "The quick brown fox jumps over the lazy dog because it wanted to see what was on the other side of the fence, and then it ran away.";

forge::GenerateResult run(forge::Generator& g, const std::vector<int>& ids, bool prefill, int n = 16) {
  return g.generate(ids, forge::GenerateOptions{n, true, prefill});
}

}  // namespace

// HF's get_rope_index (transformers 5.23) on the tiny twin's prompt: vision_start, 12 image tokens
// of a 3 × 4 merged grid, vision_end, then the text; rope_delta −8, so generated token j is at 17 + j.
TEST(Qwen3VL, PositionsOfOneImageAreHfs) {
  std::vector<int> ids{1027};
  ids.insert(ids.end(), 12, 1029);
  for (int t : {1028, 35, 279, 66, 81, 420, 68, 259, 220, 421, 630, 13}) ids.push_back(t);
  forge::MropePlan p = forge::mrope_positions(ids, 1029, 3, 4);
  Rows want{{0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
            {0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
            {0, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
  EXPECT_EQ(rows_of(p), want);
  EXPECT_EQ(p.images, (std::vector<int>{1}));
  EXPECT_EQ(p.next, int(ids.size()) - 8);
}

// Two images of a tall 4 × 2 merged grid with text before, between and after (HF, same version):
// each image enters at the running position and the text resumes at s + max(gh, gw).
TEST(Qwen3VL, PositionsOfTwoTallImagesAreHfs) {
  const int I = 1029;
  std::vector<int> ids{5, 6, 1027};
  ids.insert(ids.end(), 8, I);
  for (int t : {1028, 7, 1027}) ids.push_back(t);
  ids.insert(ids.end(), 8, I);
  for (int t : {1028, 8, 9}) ids.push_back(t);
  forge::MropePlan p = forge::mrope_positions(ids, I, 4, 2);
  Rows want{{0, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 7, 8, 9, 10, 10, 10, 10, 10, 10, 10, 10, 14, 15, 16},
            {0, 1, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 8, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 15, 16},
            {0, 1, 2, 3, 4, 3, 4, 3, 4, 3, 4, 7, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 14, 15, 16}};
  EXPECT_EQ(rows_of(p), want);
  EXPECT_EQ(p.images, (std::vector<int>{3, 14}));
  EXPECT_EQ(p.next, int(ids.size()) - 8);
}

TEST(Qwen3VL, PositionsOfTextAreTheSlotsAndBadRunsAreRefused) {
  forge::MropePlan p = forge::mrope_positions({4, 5, 6}, 1029, 3, 4);
  EXPECT_EQ(rows_of(p), (Rows{{0, 1, 2}, {0, 1, 2}, {0, 1, 2}}));
  EXPECT_EQ(p.next, 3);
  EXPECT_TRUE(p.images.empty());
  // 13 image tokens in a row: not one image of 12 (HF would take the run as one image and fail).
  std::vector<int> ids{1027};
  ids.insert(ids.end(), 13, 1029);
  try {
    forge::mrope_positions(ids, 1029, 3, 4);
    ADD_FAILURE() << "a run of 13 image tokens was taken";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt tokens 1..13 are a run of 13 image tokens (id 1029); an image is 3x4 = 12 tokens"), std::string::npos) << e.what();
  }
}

TEST(Qwen3VL, ValidatorRefusesWhatItWouldNotRunNamingTheField) {
  NEED_ENV(bundle, "FORGE_TEST_VL_BUNDLE");
  const json good = read_json(bundle + "/manifest.json");
  ASSERT_EQ(error_of(good, bundle), "");
  ASSERT_EQ(error_of(text_manifest(good), bundle), "") << "the text manifest (no vision context) loads";
  const int v = context_index(good, "vision"), s0 = context_index(good, "shard0");
  const std::string vis = "contexts[" + std::to_string(v) + "].graphs[0]", pre = "contexts[" + std::to_string(s0) + "].graphs[0]";
  // The first shard's prefill graph's inputs, by name.
  auto input = [&](json& d, const std::string& name) -> json& {
    for (json& i : d["contexts"][size_t(s0)]["graphs"][0]["inputs"])
      if (i["name"] == name) return i;
    throw std::runtime_error("no input " + name);
  };
  auto input_path = [&](const std::string& name) {
    const json& ins = good["contexts"][size_t(s0)]["graphs"][0]["inputs"];
    for (size_t i = 0; i < ins.size(); i++)
      if (ins[i]["name"] == name) return pre + ".inputs[" + std::to_string(i) + "]";
    return std::string("?");
  };
  struct Case {
    const char* what;
    std::function<void(json&)> apply;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"[N] positions", [&](json& d) { input(d, "position")["shape"] = {32}; },
       input_path("position") + ".shape: qwen3_vl_generate feeds multimodal RoPE positions [3, tokens] (rows t, h, w), not [32]"},
      {"DeepStack of an output the encoder lacks", [&](json& d) { input(d, "deepstack_0")["output"] = "deepstack_9"; },
       input_path("deepstack_0") + ".output: 'deepstack_9' is not an encoder-output of component 'vision' (its encoder-outputs: image_embeds, deepstack_0, deepstack_1, deepstack_2)"},
      {"DeepStack without output", [&](json& d) { input(d, "deepstack_0").erase("output"); },
       input_path("deepstack_0") + ": an encoder-output input of qwen3_vl_generate names the encoder's `output` it takes"},
      {"DeepStack of image_embeds", [&](json& d) { input(d, "deepstack_0")["output"] = "image_embeds"; },
       input_path("deepstack_0") + ".output: image_embeds rows replace the image tokens' embedding rows"},
      {"DeepStack of another component", [&](json& d) { input(d, "deepstack_0")["component"] = "audio"; },
       input_path("deepstack_0") + ".component: 'audio' is not the vision graph's component 'vision'"},
      {"DeepStack rows of another width", [&](json& d) { input(d, "deepstack_0")["shape"] = {1, 32, 32}; },
       input_path("deepstack_0") + ".shape: [1,32,32] must be [1, tokens, model.hidden] = [1,32,64]"},
      {"pixels of another patch size", [&](json& d) { d["contexts"][size_t(v)]["graphs"][0]["inputs"][0]["shape"] = {48, 768}; },
       vis + ".inputs[0].shape: [48,768] must be [patches, 3 · temporal · patch²] = [48,1536] for a 96x128 image (hostOpParams)"},
      {"encoder rows of another grid", [&](json& d) { d["contexts"][size_t(v)]["graphs"][0]["outputs"][1]["shape"] = {10, 64}; },
       vis + ".outputs[1].shape: [10,64] must be [image tokens, model.hidden] = [12,64]"},
      {"no image_embeds", [&](json& d) { d["contexts"][size_t(v)]["graphs"][0]["outputs"][0]["name"] = "embeds"; },
       vis + ".outputs: the vision graph needs an output named image_embeds"},
      {"a DeepStack feature no shard reads",
       [&](json& d) {
         for (json& c : d["contexts"])
           for (json& g : c["graphs"])
             if (g["role"] == "decode")
               for (json& i : g["inputs"])
                 if (i["name"] == "deepstack_2") i["output"] = "deepstack_1";
       },
       vis + ".outputs[3].name: 'deepstack_2' is read by no decode graph"},
      {"vision tokens", [&](json& d) { d["contexts"][size_t(v)]["graphs"][0]["tokens"] = 40; },
       vis + ".tokens: 40 must be the image's 48 patches"},
      {"a second vision graph",
       [&](json& d) {
         json c = d["contexts"][size_t(v)];
         c["name"] = "vision2";
         c["graphs"][0]["component"] = "vision2";
         d["contexts"].push_back(c);
       },
       ".role: a second vision graph (" + vis + " is the first)"},
      {"image size off the grid", [&](json& d) { d["hostOpParams"]["image_height"] = 100; },
       "hostOpParams: image spec: size 100x128 (HxW) must be a multiple of patch·merge = 32 on each side"},
      {"no image token", [&](json& d) { d["hostOpParams"].erase("image_token_id"); }, "hostOpParams.image_token_id: qwen3_vl_generate needs an integer here"},
      {"image token past the vocabulary", [&](json& d) { d["hostOpParams"]["image_token_id"] = 5000; }, "hostOpParams.image_token_id: 5000 is past model.vocab 1033"},
      {"a fractional size", [&](json& d) { d["hostOpParams"]["patch_size"] = 16.5; }, "hostOpParams.patch_size: 16.5 is not an integer >= 1"},
      {"mrope sections of another head", [&](json& d) { d["hostOpParams"]["mrope_section"] = "6,5,4"; },
       "hostOpParams.mrope_section: '6,5,4' sums to 15, not half the head size 32 of state 'kv.0.k'"},
      {"two means", [&](json& d) { d["hostOpParams"]["image_mean"] = "0.5,0.5"; }, "hostOpParams.image_mean: '0.5,0.5' must be 3 comma-separated numbers"},
      {"a std of zero", [&](json& d) { d["hostOpParams"]["image_std"] = "0.5,0,0.5"; }, "hostOpParams: image spec: std[1] = 0.000000 must be positive and finite"},
      {"decoder_generate's DeepStack of an absent encoder",
       [&](json& d) {
         d = text_manifest(d);
         d["hostOp"] = "decoder_generate";
       },
       ".component: 'vision' is not a component of this manifest"},
  };
  for (const Case& c : cases) {
    json doc = good;
    c.apply(doc);
    const std::string err = error_of(doc, bundle);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ":\n  expected '" << c.expect << "'\n  got      '" << err << "'";
  }
  // decoder_generate does not feed [3, N] positions (the DeepStack inputs gone, the positions are what it refuses).
  json plain = text_manifest(good);
  plain["hostOp"] = "decoder_generate";
  for (json& c : plain["contexts"])
    for (json& g : c["graphs"]) {
      json kept = json::array();
      for (json& i : g["inputs"])
        if (i["bind"] != "encoder-output") kept.push_back(i);
      g["inputs"] = kept;
    }
  // (the text manifest's shard0 is its first context)
  EXPECT_NE(error_of(plain, bundle).find("contexts[0].graphs[0]" + input_path("position").substr(pre.size()) + ".shape: [3,32]: positions [3, tokens] (multimodal RoPE) need hostOp qwen3_vl_generate"),
            std::string::npos)
      << error_of(plain, bundle);
  // In a text manifest the DeepStack inputs name one (absent) component.
  json two = text_manifest(good);
  json& ins = two["contexts"][0]["graphs"][0]["inputs"];
  for (json& i : ins)
    if (i["name"] == "deepstack_1") i["component"] = "vision2";
  EXPECT_NE(error_of(two, bundle).find(".component: 'vision2' where the other encoder-output inputs name 'vision'"), std::string::npos) << error_of(two, bundle);
}

namespace {

struct VlBundle {
  std::string dir;
  std::unique_ptr<forge_test::Loaded> l;
  forge::Tokenizer tok;
  forge::ImageReader read;
  forge::ImagePrompt image;  // the first test image, read
};

std::unique_ptr<VlBundle> open_vl(const std::string& dir) {
  auto b = std::make_unique<VlBundle>(VlBundle{dir, forge_test::load(dir), forge::Tokenizer::from_file(dir + "/tokenizer.json"), {}, {}});
  b->read = forge::find_host_op("qwen3_vl_generate")->image(b->l->manifest);
  b->image = b->read(test_images()[0]);
  return b;
}

/**
 * Free-running greedy over image prompts: batched prefill equals decode over the prompt (the image
 * rows, positions and DeepStack rows fed per slot alike), also with the image across a chunk
 * boundary; two images give two continuations; repeated calls are independent.
 */
void expect_image_generation(const char* env) {
  NEED_ENV(dir, env);
  auto b = open_vl(dir);
  forge::Generator& g = *b->l->gen;
  const forge::Manifest& m = b->l->manifest;
  ASSERT_TRUE(g.has_prefill());
  EXPECT_EQ(b->image.tokens, 12);
  ASSERT_EQ(b->image.block.size(), 14u);
  EXPECT_EQ(b->image.block.front(), int(m.host_op_numbers.at("vision_start_token_id")));
  EXPECT_EQ(b->image.block.back(), int(m.host_op_numbers.at("vision_end_token_id")));
  const std::vector<std::string> images = test_images();
  std::vector<std::vector<int>> got;
  for (const std::string& file : images) {
    forge::Pixels px = b->read(file).pixels;
    EXPECT_EQ(px.patches, 48);
    EXPECT_GT(g.encode_image(px), 0.0);
    const std::vector<int> plain = forge::image_prompt_ids(m, b->tok, b->image.block, kText, false);
    EXPECT_EQ(std::vector<int>(plain.begin(), plain.begin() + 14), b->image.block);
    EXPECT_EQ(std::vector<int>(plain.begin() + 14, plain.end()), b->tok.encode(kText));
    // The image past the first chunk: 25 text tokens, then the block across the 32-token boundary.
    std::vector<int> across = b->tok.encode(kLongText);
    across.resize(25);
    across.insert(across.end(), b->image.block.begin(), b->image.block.end());
    for (int id : b->tok.encode(kText)) across.push_back(id);
    ASSERT_GT(int(across.size()), 32);
    const std::vector<int> chat = forge::image_prompt_ids(m, b->tok, b->image.block, kText, true);
    for (const auto& ids : {plain, across, chat}) {
      forge::GenerateResult batched = run(g, ids, true), stepped = run(g, ids, false);
      EXPECT_TRUE(batched.used_prefill);
      EXPECT_EQ(batched.generated.size(), 16u);
      EXPECT_EQ(batched.generated, stepped.generated) << file << ": prefill and decode over the prompt disagree (prompt of " << ids.size() << ")";
      EXPECT_EQ(run(g, ids, true).generated, batched.generated) << "a second call differs";
    }
    got.push_back(run(g, plain, true).generated);
  }
  EXPECT_NE(got[0], got[1]) << "two different images gave the same 16 tokens";
}

}  // namespace

TEST(Qwen3VL, Fp32ImagePromptsPrefillEqualsDecode) { expect_image_generation("FORGE_TEST_VL_BUNDLE"); }
TEST(Qwen3VL, W8ImagePromptsPrefillEqualsDecode) { expect_image_generation("FORGE_TEST_VL_BUNDLE_W8"); }

// The bundle's text manifest (no vision graph; its shards' DeepStack inputs still bound) runs a text
// prompt as the vision manifest does (zeros for DeepStack, t = h = w), refuses an image.
TEST(Qwen3VL, TextManifestRunsTextAndRefusesImages) {
  NEED_ENV(dir, "FORGE_TEST_VL_BUNDLE");
  const std::string path = testing::TempDir() + "/vl-text-manifest.json";
  {
    std::ofstream out(path);
    out << text_manifest(read_json(dir + "/manifest.json")).dump(1);
  }
  forge::Manifest text = forge::load_manifest(path, dir);
  forge::Executor exec(text, {});
  auto gen = forge::make_generator(text, exec);
  auto vision = open_vl(dir);
  const std::vector<int> ids = vision->tok.encode(kLongText);
  ASSERT_GT(ids.size(), 32u);
  const auto want = run(*vision->l->gen, ids, true).generated;
  EXPECT_EQ(run(*gen, ids, true).generated, want);
  EXPECT_EQ(run(*gen, ids, false).generated, want);
  try {
    forge::find_host_op("qwen3_vl_generate")->image(text);
    ADD_FAILURE() << "a text manifest gave an image prompt";
  } catch (const forge::ManifestError& e) {
    EXPECT_NE(std::string(e.what()).find("contexts: no vision graph (role vision): this is a text manifest of the bundle"), std::string::npos) << e.what();
  }
  std::vector<int> with_image = vision->image.block;
  with_image.push_back(5);
  try {
    run(*gen, with_image, true);
    ADD_FAILURE() << "a text manifest ran image tokens";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("has no vision graph (a text manifest of the bundle)"), std::string::npos) << e.what();
  }
}

TEST(Qwen3VL, GenerateRefusesImageTokensItCannotFeed) {
  NEED_ENV(dir, "FORGE_TEST_VL_BUNDLE");
  auto b = open_vl(dir);
  std::vector<int> ids = b->image.block;
  ids.push_back(5);
  auto refused = [&](const std::vector<int>& p, const std::string& want) {
    try {
      run(*b->l->gen, p, true, 2);
      ADD_FAILURE() << "ran: " << want;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused(ids, "no image was given to the encoder");
  b->l->gen->encode_image(b->read(test_images()[1]).pixels);
  std::vector<int> two = ids;
  two.insert(two.end(), b->image.block.begin(), b->image.block.end());
  refused(two, "the prompt holds 2 images (runs of 12 image tokens); qwen3_vl_generate encodes one image per prompt");
  std::vector<int> short_run = ids;
  short_run.erase(short_run.begin() + 1);
  refused(short_run, "a run of 11 image tokens (id 1029); an image is 3x4 = 12 tokens");
}

// The tool: --image runs the encoder and reports its timings; the ids are the block then the text;
// the same ids given back with --prompt-ids (as the parity gate feeds them) give the same tokens.
TEST(Qwen3VL, ToolTakesAnImage) {
  NEED_ENV(dir, "FORGE_TEST_VL_BUNDLE");
  const std::string image = test_images()[0], m = dir + "/manifest.json";
  const std::string base = std::string(QHX_GENERATE_PATH) + " " + m + " cpu - " + dir + " 8 ";
  std::string out, err;
  ASSERT_EQ(forge_test::run_command(base + "'" + kText + "' --image " + image + " --json --ignore-eos", &out, &err), 0) << err;
  json j = json::parse(out);
  ASSERT_TRUE(j.contains("image")) << out;
  EXPECT_EQ(j["image"]["tokens"], 12);
  for (const char* k : {"decode_ms", "resize_ms", "patchify_ms", "vision_ms"}) EXPECT_GE(j["image"][k].get<double>(), 0.0) << k;
  EXPECT_GT(j["image"]["vision_ms"].get<double>(), 0.0);
  const std::vector<int> ids = j["prompt_ids"];
  EXPECT_EQ(ids[0], 1027);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1029), 12);
  std::string joined;
  for (int id : ids) joined += (joined.empty() ? "" : ",") + std::to_string(id);
  ASSERT_EQ(forge_test::run_command(base + "--prompt-ids " + joined + " --image " + image + " --json --ignore-eos", &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out)["generated_ids"], j["generated_ids"]);
  // --print-prompt-ids prints the same ids, nothing loaded.
  ASSERT_EQ(forge_test::run_command(base + "'" + kText + "' --image " + image + " --print-prompt-ids --json", &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out)["prompt_ids"], j["prompt_ids"]);
  // Refusals: ids without the image's tokens; a second --image; a file that is not there.
  EXPECT_EQ(forge_test::run_command(base + "--prompt-ids 1,2,3 --image " + image, &out, &err), 1);
  EXPECT_NE(err.find("--prompt-ids with --image: the ids hold 0 image tokens (id 1029), the image is 12 tokens"), std::string::npos) << err;
  EXPECT_EQ(forge_test::run_command(base + "x --image " + image + " --image " + image, &out, &err), 1);
  EXPECT_NE(err.find("--image given twice"), std::string::npos) << err;
  EXPECT_EQ(forge_test::run_command(base + "x --image /nonexistent.png", &out, &err), 1);
  EXPECT_NE(err.find("/nonexistent.png"), std::string::npos) << err;
}
