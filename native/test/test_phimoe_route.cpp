// The host router against HF's own sparsemixer: fixtures written by oracles/route_vectors.py
// (random rows with 16, 4 and 2 experts, exact ties, all-equal and all-zero rows, negative and
// zero maxima, near ties on both sides of 2ε, ratios exactly at float32(2ε)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "phimoe_generate/phimoe_route.h"

using nlohmann::json;

namespace {

const std::string kFixtures = FORGE_FIXTURES_DIR;

// Distance in float32 units in the last place (same-sign finite values).
int64_t ulps(float a, float b) {
  int32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return std::llabs(static_cast<int64_t>(x) - static_cast<int64_t>(y));
}

json cases() {
  std::ifstream in(kFixtures + "/phimoe-route-cases.json");
  if (!in) throw std::runtime_error("missing " + kFixtures + "/phimoe-route-cases.json");
  return json::parse(in).at("cases");
}

}  // namespace

// Experts must be HF's exactly. A weight is 1 / (sum of the unmasked exps): torch sums float32
// exps in its vectorised order, the router sums in double; measured at most 1 ulp apart on these
// rows, and a wrong mask or a missing term is off by far more (at least 1/17 of the weight).
constexpr int64_t kWeightUlps = 2;

TEST(PhimoeRoute, MatchesHfSparsemixer) {
  const json all = cases();
  ASSERT_GT(all.size(), 400u);
  int64_t worst = 0;
  int shared = 0;
  for (const json& c : all) {
    std::vector<float> logits;
    for (double v : c.at("logits")) logits.push_back(static_cast<float>(v));
    const forge::PhimoeRoute r = forge::phimoe_route(logits.data(), static_cast<int>(logits.size()), c.at("eps").get<double>());
    for (int k = 0; k < 2; k++) {
      const int want_e = c.at("experts")[k];
      const float want_w = static_cast<float>(c.at("weights")[k].get<double>());
      EXPECT_EQ(r.expert[k], want_e) << c.at("name") << " slot " << k << " logits " << c.at("logits").dump();
      const int64_t d = ulps(r.weight[k], want_w);
      worst = std::max(worst, d);
      EXPECT_LE(d, kWeightUlps) << c.at("name") << " slot " << k << ": weight " << r.weight[k] << " want " << want_w;
      shared += want_w < 1.0f;
    }
  }
  EXPECT_GT(shared, 50);  // the fixture exercises the softmax-shared case, not only weights of 1
  std::printf("phimoe_route: %zu rows, worst weight distance %lld ulp\n", all.size(), static_cast<long long>(worst));
}

TEST(PhimoeRoute, RefusesBadInput) {
  const float one[1] = {1.0f};
  EXPECT_THROW(forge::phimoe_route(one, 1, 0.01), std::invalid_argument);
  const float nan_row[3] = {0.5f, std::nanf(""), 0.1f};
  try {
    forge::phimoe_route(nan_row, 3, 0.01);
    FAIL() << "a NaN logit was routed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("router logit 1 is not finite"), std::string::npos) << e.what();
  }
}
