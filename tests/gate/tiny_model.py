"""Build a tiny Llama that the vLLM CPU engine can serve, deterministically and offline.

hidden 128, 2 layers, 4 attention heads, 2 KV heads (head_dim 32, a size CPU attention accepts),
vocab 1,024, bf16, random weights from a fixed seed. The tokenizer is a fixed word-level vocabulary
(no training), saved through PreTrainedTokenizerFast so vLLM loads it with HF_HUB_OFFLINE=1.

Run as a script to build one by hand: ``python tests/gate/tiny_model.py /tmp/tiny-llama``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SEED = 0
VOCAB_SIZE = 1024
HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS  # 32
MAX_POSITIONS = 2048

# One KV block of 32 tokens on every layer, bf16: 2 (K and V) x 2 layers x 2 KV heads x 32 x 2 bytes x 32
# = 16,384 bytes.
BLOCK_BYTES_32 = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2 * 32


def _vocab() -> dict[str, int]:
    special = ["<unk>", "<s>", "</s>"]
    words = [f"w{i}" for i in range(VOCAB_SIZE - len(special))]
    return {tok: i for i, tok in enumerate(special + words)}


# config.json fields the planner reads (the builder writes these through LlamaConfig).
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": HIDDEN,
    "intermediate_size": 256,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "max_position_embeddings": MAX_POSITIONS,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def write_tiny_llama_config(out_dir: str | Path) -> Path:
    """Only config.json: enough for the planner (no torch needed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2))
    return out


def build_tiny_llama(out_dir: str | Path) -> Path:
    """Write config.json, model.safetensors and the tokenizer files into ``out_dir``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    fields = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")}
    config = LlamaConfig(**fields)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)

    tok = Tokenizer(models.WordLevel(vocab=_vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(out)
    # save_pretrained may write a generation_config with sampling defaults; keep it minimal.
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return out


if __name__ == "__main__":
    print(build_tiny_llama(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama"))
