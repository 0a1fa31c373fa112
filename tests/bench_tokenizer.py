"""A tiny word-level tokenizer for the engines' benchmark clients, made offline.

Run with the client's own Python (its venv has `tokenizers` and `transformers`):
`python tests/bench_tokenizer.py DIR`. DIR then loads with
`AutoTokenizer.from_pretrained(DIR)`, which is all `--tokenizer DIR` asks of it.

What the clients' random datasets need from a tokenizer (sglang 0.5.23
benchmark/datasets/random.py, vllm 0.33.0 benchmarks/datasets/datasets.py): `vocab_size`
and `get_vocab()` to draw token ids from, `decode` to turn them into a prompt,
`num_special_tokens_to_add()` (0 here: no template adds tokens), and `encode` to count
the answer's tokens again. Words are separated by spaces, so a decoded prompt of N ids is N
words, the count the lab's stand-in reports as its prompt tokens.
"""

from __future__ import annotations

import sys

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

WORDS = 2048


def main(out: str) -> None:
    vocab = {"[UNK]": 0, "k2": 1}
    vocab.update({f"w{i}": i + 2 for i in range(WORDS - 2)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")
    fast.save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1])
