"""A tiny random Llama with a word-level tokenizer, made locally so a real vLLM can serve
it with no hub download (scripts/real-vllm.sh).

Token i < 2040 is the word `w<i>`, which is how kbench sends a prompt's ids as chat text,
so every prompt token is one token on the server too. The weights come from a fixed seed:
the same directory is made on every machine, and a greedy run on it is repeatable.
"""

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 2048
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
WORDS = VOCAB - len(SPECIALS)
# one role marker and the message's words, separated by spaces: a whitespace split keeps
# every word one token
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"w{i}": i for i in range(WORDS)}
    for i, s in enumerate(SPECIALS):
        vocab[s] = WORDS + i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=SPECIALS[4:],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def model(tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    return LlamaForCausalLM(config).to(torch.bfloat16)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    model(tok).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    # a prompt of `w<id>` words comes back as those ids, one each
    ids = tok("w0 w7 w2039", add_special_tokens=False)["input_ids"]
    assert ids == [0, 7, 2039], ids
    print(json.dumps({"model": str(out), "vocab": VOCAB, "words": WORDS}))


if __name__ == "__main__":
    main()
