// The one greedy decode loop (see greedy_loop.h).
#include "greedy_loop.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace forge {


/**
 * Index of the first maximum, as torch.argmax. Not std::max_element: it re-reads the best value
 * through the iterator on each element (~3.5 ns/element here), which made this the larger part of
 * the host overhead over a 248k vocab (bench/host-overhead.ts); a register max is ~5x faster.
 */
int argmax(const float* x, int n) {
  float best = x[0];
  int at = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > best) {
      best = x[i];
      at = i;
    }
  return at;
}

NonFiniteCount count_non_finite(const float* x, int64_t n) {
  // Exponent all ones ⇔ NaN or ±Inf. The first pass is branch-free integer work the compiler
  // vectorises (it runs on every token, over the whole vocabulary); only a hit walks again.
  uint32_t acc = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    acc |= (u & 0x7fffffffu) + 0x00800000u;
  }
  NonFiniteCount r;
  if (!(acc & 0x80000000u)) return r;
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) {
      if (r.first < 0) r.first = i;
      r.count++;
    }
  }
  return r;
}

NonFiniteLogits::NonFiniteLogits(int position_, int token_index_, NonFiniteCount nf, int vocab)
    : std::runtime_error("non-finite logits at generation step " + std::to_string(token_index_) + " (position " + std::to_string(position_) +
                         "): " + std::to_string(nf.count) + " of " + std::to_string(vocab) + " values are NaN or Inf (first at index " +
                         std::to_string(nf.first) + "); refusing to take their argmax"),
      position(position_),
      token_index(token_index_) {}

int GreedyGenerator::token_of(const float* logits, int position) const {
  NonFiniteCount nf = count_non_finite(logits, m_.vocab);
  if (nf.count) throw NonFiniteAt{position, nf};
  return argmax(logits, m_.vocab);
}

GenerateResult GreedyGenerator::generate(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced) {
  const int C = m_.max_context, L = int(prompt.size());
  if (L == 0) throw std::runtime_error("the prompt is empty");
  if (opts.max_new_tokens < 1) throw std::runtime_error("max_new_tokens must be at least 1");
  for (int id : prompt)
    if (id < 0 || id >= m_.vocab) throw std::runtime_error("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(m_.vocab) + ")");
  if (forced.size() > size_t(opts.max_new_tokens))
    throw std::runtime_error(std::to_string(forced.size()) + " forced ids for " + std::to_string(opts.max_new_tokens) +
                             " new tokens: at most one forced id per generated token");
  for (size_t i = 0; i < forced.size(); i++)
    if (forced[i] < 0 || forced[i] >= m_.vocab)
      throw std::runtime_error("forced id " + std::to_string(i + 1) + " (token id " + std::to_string(forced[i]) + ") is outside the vocabulary [0, " +
                               std::to_string(m_.vocab) + ")");
  // Every prompt token and every generated token but the last takes a cache slot.
  if (L + opts.max_new_tokens - 1 > C)
    throw std::runtime_error("prompt of " + std::to_string(L) + " tokens + " + std::to_string(opts.max_new_tokens) +
                             " new tokens needs " + std::to_string(L + opts.max_new_tokens - 1) + " positions; the bundle's maxContext is " + std::to_string(C));
  reset();

  GenerateResult res;
  res.generated.reserve(size_t(opts.max_new_tokens));  // the decode loop allocates nothing
  try {
    loop(prompt, opts, forced, res);
  } catch (const NonFiniteAt& at) {
    // The logits at position p choose generated token p - (L - 1).
    throw NonFiniteLogits(at.position, at.position - (L - 1), at.nf, m_.vocab);
  }
  return res;
}

void GreedyGenerator::loop(const std::vector<int>& prompt, const GenerateOptions& opts, const std::vector<int>& forced, GenerateResult& res) {
  const int L = int(prompt.size());
  double run_ms = 0;
  auto t0 = Clock::now();
  int next;
  // A one-token prompt is decoded: one call either way, reading the same weights, and the decode
  // graph computes one row where a prefill call computes N.
  if (const int P = prefill_tokens(); P > 0 && opts.use_prefill && L > 1) {
    res.used_prefill = true;
    for (int s = 0;; s += P) {
      int valid = std::min(P, L - s);
      bool last = s + valid == L;
      next = step(prompt.data() + s, s, valid, last, true, &run_ms);
      if (last) break;
    }
  } else {
    for (int t = 0; t < L; t++) next = step(prompt.data() + t, t, 1, t == L - 1, false, &run_ms);
  }
  res.timings.prefill_ms = ms_since(t0);

  double decode_ms = 0, decode_run_ms = 0;
  for (;;) {
    res.generated.push_back(next);
    // The token the sequence goes on with: the forced one while there is one (teacher-forced), else
    // the runtime's own choice. EOS ends the sequence it goes on with.
    const size_t k = res.generated.size() - 1;
    const int fed = k < forced.size() ? forced[k] : next;
    if (!opts.ignore_eos && std::find(m_.eos.begin(), m_.eos.end(), fed) != m_.eos.end()) {
      res.stopped_at_eos = true;
      break;
    }
    if (int(res.generated.size()) == opts.max_new_tokens) break;
    int pos = L + int(res.generated.size()) - 1;
    auto s0 = Clock::now();
    double step_run = 0;
    next = step(&fed, pos, 1, true, false, &step_run);
    decode_ms += ms_since(s0);
    decode_run_ms += step_run;
    res.timings.decode_steps++;
  }
  if (int n = res.timings.decode_steps) {
    res.timings.decode_ms_per_token = decode_ms / n;
    res.timings.host_overhead_ms_per_token = (decode_ms - decode_run_ms) / n;
  }
}

}  // namespace forge
