"""The tiny model: a deterministic tokenizer and weights, printable greedy tokens only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from shadow_ab.dev.engines import tinymodel

SMALL = tinymodel.ModelSpec(vocab_size=400, corpus_sentences=300)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tinymodel.build(tmp_path_factory.mktemp("model") / "tiny", SMALL)


def test_the_folder_holds_what_vllm_reads(built: Path) -> None:
    names = {p.name for p in built.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= names
    config = json.loads((built / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] == SMALL.hidden_size
    assert config["head_dim"] in (32, 64, 80, 96, 112, 128)  # what vLLM's CPU attention takes
    tensors = load_file(str(built / "model.safetensors"))
    assert tensors["model.embed_tokens.weight"].shape == (config["vocab_size"], 64)
    assert tensors["model.layers.1.mlp.down_proj.weight"].shape == (64, 128)
    assert f"model.layers.{SMALL.num_layers}.mlp.up_proj.weight" not in tensors


def test_chat_template_renders_turns_and_the_generation_prompt(built: Path) -> None:
    import jinja2

    template = json.loads((built / "tokenizer_config.json").read_text())["chat_template"]
    text = jinja2.Template(template).render(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
    )
    assert text == "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
    tokenizer = Tokenizer.from_file(str(built / "tokenizer.json"))
    ids = tokenizer.encode(text).ids
    assert tokenizer.token_to_id("<|user|>") in ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_lm_head_keeps_only_printable_tokens(built: Path) -> None:
    tokenizer = Tokenizer.from_file(str(built / "tokenizer.json"))
    head = load_file(str(built / "model.safetensors"))["lm_head.weight"]
    live = np.flatnonzero(np.abs(head).sum(axis=1) > 0)
    assert len(live) > 100
    for token_id in live:
        text = tokenizer.decode([int(token_id)])
        assert text and all(ch == "\n" or " " <= ch <= "~" for ch in text), repr(text)
    for special in tinymodel.SPECIAL_TOKENS:
        assert not head[tokenizer.token_to_id(special)].any()
    # every byte still encodes (byte-level alphabet): non-ASCII text round-trips
    assert tokenizer.decode(tokenizer.encode("héllo ✓").ids) == "héllo ✓"


def test_same_seed_same_files_and_a_kept_folder(built: Path, tmp_path: Path) -> None:
    again = tinymodel.build(tmp_path / "again", SMALL)
    for name in ("tokenizer.json", "config.json", "model.safetensors"):
        assert (again / name).read_bytes() == (built / name).read_bytes(), name
    before = (again / "model.safetensors").stat().st_mtime_ns
    tinymodel.build(again, SMALL)
    assert (again / "model.safetensors").stat().st_mtime_ns == before
    other = tinymodel.build(
        again, tinymodel.ModelSpec(seed=1, vocab_size=400, corpus_sentences=300)
    )
    assert tinymodel.built_spec(other) == tinymodel.ModelSpec(
        seed=1, vocab_size=400, corpus_sentences=300
    )
    assert (other / "model.safetensors").read_bytes() != (built / "model.safetensors").read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["again"]  # no half-built folder left
