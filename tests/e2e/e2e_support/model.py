"""The model the end-to-end suite serves: a randomly initialised 2-layer Llama and a WordLevel
tokenizer of 1000 words, written with `transformers` in seconds (nothing downloaded).

    python -m e2e_support.model DIR

Greedy outputs of a random model are as deterministic as a trained one's, which is all the
suite needs: the same prompt through the prefill/decode pair and through a single server must
give the same tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["VOCAB", "WORDS", "make_model"]

VOCAB = 1000
SPECIAL = ("<unk>", "<s>", "</s>")
WORDS = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
SEED = 1234


def make_model(folder: Path) -> Path:
    """Write the model and tokenizer into `folder` (once: an existing one is reused)."""
    marker = folder / "e2e-model.json"
    if marker.exists():
        return folder
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {word: i for i, word in enumerate([*SPECIAL, *WORDS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    LlamaForCausalLM(config).save_pretrained(folder)
    marker.write_text(json.dumps({"seed": SEED, "vocab": VOCAB}))
    return folder


if __name__ == "__main__":
    print(make_model(Path(sys.argv[1])))
