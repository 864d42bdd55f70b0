"""The tiny twins' training text: one passage per training sequence, each read from position 0.

make_twin.py trains every twin's tokenizer and text model on PASSAGES until it has memorised them,
so a greedy continuation of any recipe prompt is the passage that starts with it, predicted with a
trained model's confidence. Rules that keep those continuations unambiguous:
  - every prompt in PROMPTS starts exactly one passage, and is followed there by more tokens than
    a twin is traced for (check());
  - no other passage starts with the same words, so the first tokens decide which text follows.
The rest is variety a real tokenizer and model meet: templated facts, code, German with umlauts
and ß, Russian, Japanese, Chinese, and a few emoji (byte-level BPE, so any text tokenizes).
"""

LONG_PROMPT = (
    "The lighthouse keeper of the northern island kept a careful diary for forty years. Every "
    "evening he climbed the one hundred and twelve steps of the tower, cleaned the great glass "
    "lens, filled the lamp with oil and wrote down the wind, the waves and the ships that passed. "
    "One cold night in December, long after midnight, he saw a small red boat without sails "
    "drifting towards the rocks, and he"
)
NON_ASCII_PROMPT = "Grüße aus München! Die Straße am Fluss heißt"

# Each prompt a recipe (or a test) generates from, with the passage that continues it.
PROMPTED = {
    "The capital of France is": (
        " Paris. Paris is a large city on the river Seine, famous for its museums, its cafes and "
        "the tall iron tower built for a world fair. Every spring the parks are full of flowers, "
        "and every summer visitors walk along the river, climb the hill of the white church and "
        "eat bread and cheese on the grass until the sun goes down."),
    "Once upon a time": (
        " there was a little girl who lived in a small house at the edge of a dark forest. Every "
        "morning she walked to the village to buy bread, milk and eggs for her grandmother. One "
        "day a grey wolf stepped out from behind a tree and asked her where she was going. The "
        "girl was not afraid, and the wolf walked beside her to the village gate."),
    "The quick brown fox jumps over the lazy dog": (
        ". The lazy dog did not move; it only opened one eye and closed it again. The fox ran on "
        "across the field, past the old barn and the pond with the white ducks, and into the "
        "woods where its family lived under the roots of an oak tree. The farmer saw nothing, "
        "because he was asleep in his chair by the kitchen window."),
    "Water boils at a temperature of": (
        " one hundred degrees Celsius at sea level, and it freezes at zero degrees. At the top of "
        "a high mountain water boils at a lower temperature, because the air pressure is lower, "
        "so cooking an egg there takes longer. When water freezes it grows larger, and ice floats "
        "on lakes, so the fish live in the cold water below it."),
    "My favourite colour is": (
        " blue, like the sky on a clear summer day and the sea in the small harbour where my "
        "father kept his boat. My sister likes green, the colour of fresh grass, and my brother "
        "likes red, because his first bicycle was red. Our kitchen is painted yellow, and in the "
        "morning the whole room glows like a lemon."),
    LONG_PROMPT: (
        " ran down the steps with a lantern in his hand. The wind pulled at his coat and the rain "
        "hit his face like small stones. On the rocks below he found two children in the boat, "
        "wet and cold, holding a wooden box. He carried them up to the tower, gave them dry "
        "blankets and hot soup, and sat with them by the stove until morning."),
    NON_ASCII_PROMPT: (
        " Uferstraße, und dort gibt es jeden Samstag einen großen Markt mit Äpfeln, Käse und "
        "frischem Brot. Die Kinder trinken heiße Schokolade. Auf Russisch sagt man: Привет, как "
        "дела? Auf Japanisch: こんにちは、元気ですか。 Auf Chinesisch: 你好，今天天气很好。 Und "
        "zum Schluss ein Lächeln 😊 für alle Freunde."),
}

# Templated facts: one passage per table row, each starting with its own words.
COUNTRIES = [
    ("Germany", "Berlin", "German", "euro", "the Rhine"),
    ("Italy", "Rome", "Italian", "euro", "the Tiber"),
    ("Spain", "Madrid", "Spanish", "euro", "the Tagus"),
    ("Japan", "Tokyo", "Japanese", "yen", "the Shinano"),
    ("Egypt", "Cairo", "Arabic", "pound", "the Nile"),
]
FACT = "Atlas entry for {0}: the capital is {1}, people speak {2}, pay with the {3} and live by {4}."

CODE = [
    ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
     "    return a\n"),
    "function greet(name) {\n  console.log(`Hello, ${name}!`);\n}\n",
    "{\"name\": \"tiny-twin\", \"layers\": 4, \"tied\": true}\n",
]

OTHER = [
    "Question: What is two plus two? Answer: Two plus two is four.",
    "Москва — столица России. Зимой в Москве холодно, а летом тепло. Я люблю читать книги.",
    "東京は日本の首都です。春には桜が咲きます。私は毎朝お茶を飲みます。",
    "北京是中国的首都。我喜欢喝茶，也喜欢看书。",
    "Thank you for your help. You are welcome. Good morning, how are you today? 👍",
]

PROMPTS = list(PROMPTED)
PASSAGES = ([p + c for p, c in PROMPTED.items()] + [FACT.format(*row) for row in COUNTRIES]
            + CODE + OTHER)


def check(count_tokens, min_continuation):
    """The rules in the module docstring, as one error naming the passage that breaks them;
    count_tokens(text) is the twin tokenizer's count."""
    for p, c in PROMPTED.items():
        n = count_tokens(p + c) - count_tokens(p)
        if n < min_continuation:
            raise ValueError(f"twin_corpus: the passage after {p[:40]!r} continues for {n} tokens, "
                             f"under {min_continuation}")
    starts = [" ".join(t.split()[:4]) for t in PASSAGES]
    for s in starts:
        if starts.count(s) > 1:
            raise ValueError(f"twin_corpus: {starts.count(s)} passages start with {s!r}")
