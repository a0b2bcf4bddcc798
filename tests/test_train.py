"""The training pipeline: seeded data that conforms to its schemas, the tokenizer layout, a micro training run."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from safetensors.torch import load_file

from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel
from dllm_constrain.train.data import ExampleGenerator
from dllm_constrain.train.tokenizer import BOS, EOS, MASK, PAD, SPECIALS, train_tokenizer
from dllm_constrain.train.trainer import TrainConfig, train


def test_generator_is_reproducible_by_seed():
    assert ExampleGenerator(7).examples(50) == ExampleGenerator(7).examples(50)
    assert ExampleGenerator(7).examples(50) != ExampleGenerator(8).examples(50)


def test_every_schema_answer_conforms_to_its_schema():
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for ex in ExampleGenerator(3).examples(500):
        if ex["schema"] is not None:
            jsonschema.Draft202012Validator(ex["schema"], format_checker=checker).validate(json.loads(ex["answer"]))


def test_schema_is_part_of_the_prompt_and_plain_text_examples_exist():
    examples = ExampleGenerator(0).examples(300)
    with_schema = [e for e in examples if e["schema"] is not None]
    assert with_schema and len(with_schema) < len(examples)
    for e in with_schema:
        assert json.dumps(e["schema"], separators=(",", ":")) in e["prompt"]


def test_stated_values_appear_in_the_answer():
    for e in ExampleGenerator(5).examples(200):
        answer = json.loads(e["answer"]) if e["schema"] else None
        for key, value in e["stated"].items():
            assert answer[key] == value


def test_tokenizer_has_distinct_specials_and_prepends_bos():
    tok = train_tokenizer((e["prompt"] + e["answer"] for e in ExampleGenerator(0).examples(300)), vocab_size=400)
    assert [tok.token_to_id(s) for s in SPECIALS] == [BOS, EOS, PAD, MASK]
    assert MASK != PAD
    assert tok.encode("hello").ids[0] == BOS
    text = '{"name":"Zoë ☃"}'
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("micro")
    cfg = TrainConfig(out=str(out), vocab_size=300, tokenizer_corpus=300, d_model=32, n_layers=1, n_heads=2,
                      mlp_hidden_size=64, max_canvas=32, batch_size=4, steps=6, log_every=100, threads=1)
    return out, train(cfg)


def test_micro_training_writes_a_loadable_llada_checkpoint(micro_run):
    out, summary = micro_run
    assert {"config.json", "model.safetensors", "tokenizer.json", "loss_curve.png"} <= {p.name for p in out.iterdir()}
    cfg = LLaDAConfig.from_dict(json.loads((out / "config.json").read_text()))
    model = LLaDAModel(cfg)
    model.load_state_dict(load_file(str(out / "model.safetensors")))
    assert summary["steps_done"] == 6


def test_micro_training_is_reproducible_by_seed(micro_run, tmp_path):
    out, summary = micro_run
    cfg = TrainConfig(out=str(tmp_path), vocab_size=300, tokenizer_corpus=300, d_model=32, n_layers=1, n_heads=2,
                      mlp_hidden_size=64, max_canvas=32, batch_size=4, steps=6, log_every=100, threads=1)
    again = train(cfg)
    assert again["final_loss_ema"] == pytest.approx(summary["final_loss_ema"], rel=1e-5)
    a = load_file(str(out / "model.safetensors"))
    b = load_file(str(tmp_path / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_micro_training_writes_the_measured_decoding_defaults(micro_run):
    """A retrained bundled model keeps the decoding defaults the engine benchmarks chose (threshold 0.9)."""
    from dllm_constrain.api import GenerationDefaults

    out, _ = micro_run
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["policy"] == "threshold" and gen["threshold"] == 0.9
    defaults = GenerationDefaults.from_folder(out)
    assert defaults.policy == "threshold"
