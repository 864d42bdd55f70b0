"""Hugging Face's side of test/chat-template.test.ts.

    python hf_chat.py tokenizers OUT FAMILY...   OUT/<family>/: the tokenizer files make_twin.py
                                                 saves for that family's twin (its model untrained:
                                                 the tokenizer is made before the model and alone)
    python hf_chat.py apply REQUEST.json         prints, per {dir, texts, kwargs?} of the request, per
                                                 text transformers' apply_chat_template of one user
                                                 turn with a generation prompt and the kwargs (the
                                                 template's switches, e.g. enable_thinking): {text,
                                                 ids} or {error}
"""
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "oracles"))


def tokenizers(out, families):
    import make_twin  # noqa: E402  (imports torch and transformers)
    for family in families:
        style = make_twin.TOKENIZER_STYLES[make_twin.FAMILIES[family][0]]
        make_twin.train_tokenizer(style).save_pretrained(os.path.join(out, family), save_jinja_files=False)


def apply(request):
    import transformers
    result = []
    for case in request:
        tok = transformers.AutoTokenizer.from_pretrained(case["dir"])
        kwargs = case.get("kwargs", {})
        rows = []
        for text in case["texts"]:
            chat = [{"role": "user", "content": text}]
            try:
                rendered = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, **kwargs)
                ids = tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=False, **kwargs)
                rows.append({"text": rendered, "ids": list(ids)})
            except Exception as e:  # a template that refuses the turn: the test expects forge to refuse it too
                rows.append({"error": f"{type(e).__name__}: {e}"})
        result.append(rows)
    return result


if __name__ == "__main__":
    if sys.argv[1] == "tokenizers":
        tokenizers(sys.argv[2], sys.argv[3:])
    else:
        with open(sys.argv[2]) as f:
            print(json.dumps(apply(json.load(f)), ensure_ascii=False))
