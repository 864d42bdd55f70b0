#!/usr/bin/env python3
"""Test vectors for the host's PhiMoE router (native/src/phimoe_route.cpp), from HF's own function.

    python oracles/route_vectors.py --out native/test/fixtures/phimoe-route-cases.json

Calls transformers' `sparsemixer` (models/phimoe/modeling_phimoe.py) at inference (training=False)
on float32 router-logit rows, one row per call, and writes each row with the experts and weights it
returns (slot order: the first pick, then the second). Rows: random (16 experts like
Phi-tiny-MoE, 4 like the tiny twin, 2, several scales), exact ties (torch's max takes the first
maximal index), all-equal rows, negative maxima, zero maxima (the mask ratio is 0/0 = NaN, which
does not mask), near ties on both sides of the 2ε threshold in both slots, and rows whose mask ratio
is exactly float32(2ε). torch compares the float32 ratio with 2ε cast to float32: with ε = 0.05,
float32(0.1) rounds up and a ratio equal to it is not masked, where a comparison in double would
mask it; the `eps_0.05` rows pin that.

Every value is a float32 written as the shortest decimal that reads back to the same double,
which is exactly that float32. Deterministic: fixed seeds; reruns give the same bytes.
"""
import argparse
import json
import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.models.phimoe.modeling_phimoe import sparsemixer  # noqa: E402

F32 = np.float32


def ratio(m, s):
    """The float32 mask ratio HF computes: (m - s) / max(|s|, m)."""
    m, s = F32(m), F32(s)
    return F32(F32(m - s) / max(F32(abs(s)), m))


def at_threshold(rng, eps, n_experts, want):
    """A row whose second-largest logit's ratio to the max is exactly float32(2 eps) (or, with
    want='above', one float32 step above it): searched over random maxima."""
    t = F32(2 * eps)
    for _ in range(100000):
        m = F32(rng.uniform(0.5, 4.0) * rng.choice([1, -1]))
        guess = F32(m * (1 - t)) if m > 0 else F32(m / (1 - t))
        for k in range(-8, 9):
            s = F32(guess + k * np.spacing(guess))
            r = ratio(m, s)
            if (want == "equal" and r == t) or (want == "above" and r == np.nextafter(t, F32(1))):
                row = rng.normal(0, 1, n_experts).astype(F32) + F32(m) - F32(10)  # far below
                i, j = rng.choice(n_experts, 2, replace=False)
                row[i], row[j] = m, s
                return row
    raise RuntimeError(f"no row with a ratio {want} to float32(2*{eps}) found")


def rows(rng):
    out = []

    def add(name, eps, row):
        out.append((name, eps, np.asarray(row, dtype=F32)))

    for n in (16, 4, 2):
        for scale in (0.1, 1.0, 10.0):
            for _ in range(60 if n == 16 else 30):
                add(f"random_{n}", 0.01, rng.normal(0, scale, n))
    for n in (16, 4):
        for _ in range(20):  # near ties in the first and in the second slot, both sides of 2 eps
            row = rng.normal(0, 1, n).astype(F32)
            i, j, k = rng.choice(n, 3, replace=False)
            m = F32(abs(rng.normal(2, 0.5)) * rng.choice([1, -1]))
            row[i] = m
            row[j] = F32(m - abs(m) * F32(rng.uniform(0.015, 0.025)))
            row[k] = F32(row[j] - abs(row[j]) * F32(rng.uniform(0.015, 0.025)))
            add(f"near_tie_{n}", 0.01, row)
        for want in ("equal", "above"):
            for _ in range(5):
                add(f"threshold_{want}_{n}", 0.01, at_threshold(rng, 0.01, n, want))
                add(f"threshold_{want}_{n}_eps_0.05", 0.05, at_threshold(rng, 0.05, n, want))
        add(f"all_equal_{n}", 0.01, [0.75] * n)
        add(f"all_zero_{n}", 0.01, [0.0] * n)
        add(f"tie_first_{n}", 0.01, [1.0, 3.0] + [3.0] * (n - 2) if n > 2 else [3.0, 3.0])
        row = [-5.0] * n
        row[n - 1] = row[1] = 2.5
        add(f"tie_spread_{n}", 0.01, row)  # the lower index first, the other second
        add(f"negative_{n}", 0.01, -np.abs(rng.normal(1, 0.3, n)))
        row = (-np.abs(rng.normal(1, 0.3, n)) - 0.6).astype(F32)
        row[2] = F32(-0.5)
        row[0] = F32(-0.505)  # within 2 eps of a negative max (ratio 0.0099)
        add(f"negative_near_tie_{n}", 0.01, row)
        row = np.full(n, -1.0, dtype=F32)
        row[0] = row[3 % n] = 0.0  # max 0 with another 0: ratio 0/0, not masked
        add(f"zero_max_{n}", 0.01, row)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(20261125)
    cases = []
    for name, eps, row in rows(rng):
        w, e = sparsemixer(torch.from_numpy(row)[None], jitter_eps=eps, training=False, top_k=2)
        cases.append({"name": name, "eps": eps, "logits": [float(x) for x in row],
                      "experts": e[0].tolist(), "weights": [float(x) for x in w[0]]})
    doc = {"generator": "oracles/route_vectors.py", "function": "transformers.models.phimoe.modeling_phimoe.sparsemixer",
           "transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}
    with open(args.out, "w") as f:
        f.write(json.dumps(doc, indent=0, sort_keys=True) + "\n")
    print(json.dumps({"out": args.out, "cases": len(cases),
                      "shared_weight": sum(1 for c in cases if min(c["weights"]) < 1)}))


if __name__ == "__main__":
    main()
