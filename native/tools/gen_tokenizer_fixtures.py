#!/usr/bin/env python3
"""Writes the tokenizer fixtures the C++ tests compare against (native/test/fixtures/):

  tiny-qwen3.tokenizer.json   the tiny twin's tokenizer (ByteLevel pre-tokenizer, GPT-2 regex)
  bpe32k.tokenizer.json       a 32k byte-level BPE trained here with HF `tokenizers` on local text,
                              set up the way Qwen's is: NFC, Split(Qwen regex, Isolated),
                              ByteLevel(use_regex=false), special and added tokens
  tokenizer-cases.json        for each: strings → HF ids, decode(ids) with and without special
                              tokens, and decodes of arbitrary id runs (some splitting UTF-8)

Run with a Python that has `tokenizers` (the tiny twin's tokenizer.json comes from a forge bundle):
  python native/tools/gen_tokenizer_fixtures.py --tiny <bundle>/tokenizer.json
Deterministic: fixed seeds, sorted corpus files.
"""
import argparse
import glob
import json
import os
import random
import shutil
import sysconfig

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import AddedToken

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "test", "fixtures")
QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Hand-picked strings: the regex's corners (contractions, digit runs, whitespace kinds, newlines),
# scripts, combining marks (NFC), emoji sequences, special and added tokens with their neighbours.
HAND = [
    "", " ", "  ", "\n", "\n\n\n", "\r\n", " \r\n ", "\t\tindent", "a", "The capital of France is", "Once upon a time",
    "Hello, world!", "Hello  world   spaced    out", "trailing space ", " leading space", "x \n y", "tab\there",
    "It's, I'M, they'Re, we'VE, she'll, he'd, don't, 'S", "'s's's", "ſ'ſ 'ſ 'K", "rock 'n' roll", "l'été",
    "1234567890", "3.14159 2.71828 1e-10", "tel: +1 (555) 123-4567", "v1.2.3-rc.4", "0x1F600 0b1010", "٣٤٥ ൬ ໒ 二十三",
    "Ⅻ ⅷ ½ ¾ ² ³", "café naïve coöperate résumé", "cafe\u0301 nai\u0308ve", "e\u0301\u0323 a\u0323\u0307", "Å Å Å",
    "한국어 텍스트", "\u1100\u1161\u11a8", "日本語のテキスト、カタカナ。", "中文文本，标点符号。", "Ελληνικά κείμενα", "Русский текст, ёжик",
    "עברית טקסט", "نص عربي مع أرقام ١٢٣", "हिन्दी पाठ", "ไทย ภาษา", "Tiếng Việt có dấu",
    "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️", "flags 🇫🇷🇯🇵", "math ∑∫√∞≠≤≥ →⇒", "zero\u200bwidth\u200djoiner", "nbsp\u00a0here",
    "em\u2003space\u3000ideographic", "odd\x0bvt\x0cff\x1cfs\x85nel", "\u2028line\u2029para",
    "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "a<|im_end|>b", "<|im_start|><|im_end|>",
    "<think>\nreasoning\n</think>\n\nanswer", "x <think> y", "<|im_start", "<|endoftext|><|endoftext|>",
    "def f(x):\n    return x ** 2  # square\n", "if (a && b || !c) { return; }", "path/to/file.txt C:\\Windows\\System32",
    "https://example.com/a?b=c&d=e#f", "user@example.org", "#hashtag @mention $100 50% ^_^ ~~ ``` ***",
    "ALL CAPS SHOUTING", "MiXeD cAsE wOrDs", "snake_case camelCase kebab-case PascalCase", "...!!!???", "—–-‐ “quotes” ‘single’ «guillemets»",
    "a" * 300, " " * 50 + "x", "\n" * 20 + "end", "ab" * 100, "9" * 40,
]


def local_text(limit_bytes):
    """Text files found on this machine: Python's stdlib and its test data, docs, X11 compose tables."""
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "test", "cjkencodings", "*-utf8.txt")))
    files += ["/usr/share/X11/locale/en_US.UTF-8/Compose"]
    files += sorted(glob.glob(os.path.join(stdlib, "test", "test_*.py")))
    files += sorted(glob.glob(os.path.join(stdlib, "*.py")))
    files += sorted(glob.glob("/usr/share/i18n/locales/*"))
    texts, total = [], 0
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                t = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(t)
        total += len(t)
        if total > limit_bytes:
            break
    return texts


def train_bpe(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken("<think>", normalized=True, special=False),
                    AddedToken("</think>", normalized=True, special=False),
                    AddedToken("<tool>", lstrip=True, rstrip=True, normalized=False, special=True)])
    return tok


def random_strings(rng, n):
    pools = ["abcXYZ", "0123456789٣", " \t\n\r\u00a0\u3000\x0b\x85", "'sSlLdDmM", ".,!?;:-_()[]{}<>/\\\"#",
             "éüñçÅ\u0301\u0308\u0323", "日本語한국어中文", "😀👍🏽\u200d❤️", "ſK"]
    out = []
    for _ in range(n):
        s = "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 40)))
        if rng.random() < 0.2:
            s += rng.choice(["<|im_end|>", "<think>", " <tool> ", "<|endoftext|>"]) + s[::-1]
        out.append(s)
    return out


def corpus_lines(texts, rng, n):
    lines = [l for t in texts for l in t.splitlines(keepends=True) if l.strip()]
    picks = rng.sample(lines, min(n, len(lines)))
    # Some multi-line chunks too: newlines and indentation between lines matter to the regex.
    for _ in range(n // 10):
        i = rng.randrange(len(lines) - 5)
        picks.append("".join(lines[i:i + 5]))
    return picks


def cases(tok, strings, rng):
    out = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False).ids
        out.append({"text": s, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                    "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    vocab = tok.get_vocab_size(with_added_tokens=True)
    runs = []
    for _ in range(60):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
        runs.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    return out, runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", required=True, help="the tiny twin's tokenizer.json")
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(1234)

    shutil.copyfile(args.tiny, os.path.join(OUT, "tiny-qwen3.tokenizer.json"))
    texts = local_text(12_000_000)
    big = train_bpe(texts, args.vocab)
    big.save(os.path.join(OUT, "bpe32k.tokenizer.json"), pretty=False)
    # Reload from disk: the fixtures must describe the file the C++ side reads.
    tiny = Tokenizer.from_file(os.path.join(OUT, "tiny-qwen3.tokenizer.json"))
    big = Tokenizer.from_file(os.path.join(OUT, "bpe32k.tokenizer.json"))

    strings = HAND + random_strings(rng, 200) + corpus_lines(texts, rng, 400)
    result = []
    for name, tok in [("tiny-qwen3.tokenizer.json", tiny), ("bpe32k.tokenizer.json", big)]:
        c, runs = cases(tok, strings, rng)
        result.append({"tokenizer": name, "cases": c, "id_runs": runs})
    with open(os.path.join(OUT, "tokenizer-cases.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=0)
    print(f"{len(strings)} strings x 2 tokenizers; vocab {big.get_vocab_size()}")


if __name__ == "__main__":
    main()
