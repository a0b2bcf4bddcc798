"""The training pipeline: seeded data that conforms to its schemas, the tokenizer layout, a micro training run."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel
from dllm_constrain.prompting import schema_sketch
from dllm_constrain.train.data import ExampleGenerator
from dllm_constrain.train.heldout import HELDOUT_SEED
from dllm_constrain.train.phrasing import HELDOUT, TRAIN
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


def test_the_prompt_carries_the_schema_as_a_field_sketch_and_plain_text_examples_exist():
    examples = ExampleGenerator(0).examples(300)
    with_schema = [e for e in examples if e["schema"] is not None]
    assert with_schema and len(with_schema) < len(examples)
    for e in with_schema:
        assert f"Fields: {schema_sketch(e['schema'])}\n" in e["prompt"]
        assert e["prompt"].startswith(f"Request: {e['request']}\n")


def test_heldout_split_uses_lead_phrasings_the_training_split_never_produces():
    train_leads = {lead for lead in TRAIN.leads if lead}
    for e in ExampleGenerator(11, plain_text_share=0.0, split="heldout").examples(100):
        assert not any(e["request"].startswith(lead) for lead in train_leads)
    assert set(HELDOUT.pairs).isdisjoint(TRAIN.pairs) and set(HELDOUT.leads).isdisjoint(TRAIN.leads)
    assert set(HELDOUT.bool_pairs).isdisjoint(TRAIN.bool_pairs)


def test_simple_share_gives_flat_requests_of_one_to_three_short_fields():
    examples = ExampleGenerator(5, plain_text_share=0.0, simple_share=1.0).examples(200)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for e in examples:
        props = e["schema"]["properties"]
        assert 1 <= len(props) <= 3
        assert all(p["type"] in ("string", "integer", "boolean") for p in props.values())
        jsonschema.Draft202012Validator(e["schema"], format_checker=checker).validate(json.loads(e["answer"]))
        for value in e["stated"].values():
            if isinstance(value, str):
                assert value in e["request"]


def test_copy_share_gives_copy_tasks_whose_answer_is_read_from_the_request():
    examples = ExampleGenerator(6, copy_share=1.0).examples(100)
    for e in examples:
        assert e["schema"] is None
        words = e["answer"].replace(",", "").replace("!", "").split()
        assert all(w in e["request"] for w in words if w != "Hello")


@pytest.mark.parametrize("share", ["plain_text_share", "simple_share", "copy_share"])
def test_a_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError, match=share):
        ExampleGenerator(0, **{share: 1.5})


def test_values_come_from_open_distributions():
    """Hardly any stated string value repeats across 500 requests: the model cannot pick from a list."""
    strings = [v for e in ExampleGenerator(2, plain_text_share=0.0).examples(500) for v in e["stated"].values()
               if isinstance(v, str) and len(v) > 6]
    assert len(strings) > 300 and len(set(strings)) > 0.95 * len(strings)


def test_every_stated_value_is_written_in_the_request():
    for e in ExampleGenerator(4, plain_text_share=0.0).examples(300):
        for value in e["stated"].values():
            if isinstance(value, str):
                assert value in e["request"]


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
    cfg = TrainConfig(out=str(out), run_dir=str(out / "run"), vocab_size=300, tokenizer_corpus=300, d_model=32, n_layers=1, n_heads=2,
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
    cfg = TrainConfig(out=str(tmp_path), run_dir=str(tmp_path / "run"), vocab_size=300, tokenizer_corpus=300, d_model=32, n_layers=1, n_heads=2,
                      mlp_hidden_size=64, max_canvas=32, batch_size=4, steps=6, log_every=100, threads=1)
    again = train(cfg)
    assert again["final_loss_ema"] == pytest.approx(summary["final_loss_ema"], rel=1e-5)
    a = load_file(str(out / "model.safetensors"))
    b = load_file(str(tmp_path / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_micro_training_writes_the_measured_decoding_defaults(micro_run):
    """A retrained bundled model keeps the decoding defaults the held-out figures chose (threshold 0.97), the ones
    the shipped checkpoint carries."""
    from dllm_constrain.api import GenerationDefaults, bundled_model_path

    out, _ = micro_run
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["policy"] == "threshold" and gen["threshold"] == 0.97
    defaults = GenerationDefaults.from_folder(out)
    assert defaults.policy == "threshold" and defaults.threshold == 0.97
    shipped = GenerationDefaults.from_folder(bundled_model_path())
    assert (shipped.policy, shipped.threshold) == (defaults.policy, defaults.threshold)


def _micro_config(tmp_path, **overrides) -> TrainConfig:
    base = dict(out=str(tmp_path / "out"), run_dir=str(tmp_path / "run"), vocab_size=300, tokenizer_corpus=300,
                d_model=32, n_layers=1, n_heads=2, mlp_hidden_size=64, max_canvas=48, batch_size=4, steps=8,
                log_every=100, threads=1, save_every=4, eval_every=4, eval_batches=1)
    base.update(overrides)
    return TrainConfig(**base)


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    straight = train(_micro_config(tmp_path / "a"))
    train(_micro_config(tmp_path / "b", steps=8, max_minutes=1e-9))  # stops after its first step
    resumed = train(_micro_config(tmp_path / "b", resume=True))
    a = load_file(str(tmp_path / "a" / "out" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "out" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["steps_done"] == straight["steps_done"] == 8


def test_the_log_holds_every_step_once_and_held_out_losses(tmp_path):
    from dllm_constrain.train.report import read_log

    train(_micro_config(tmp_path, max_minutes=1e-9))
    train(_micro_config(tmp_path, resume=True))
    steps, evals = read_log(tmp_path / "run" / "log.jsonl")
    assert [r["step"] for r in steps] == list(range(8))
    assert [r["step"] for r in evals] == [4, 8]


def test_a_token_shift_run_exports_a_checkpoint_the_engine_serves(tmp_path):
    """--token-shift trains LLaDA with the input token shift; the export carries the flag and its two tensors, and
    the loader and the engine's cached forward serve it."""
    import dllm_constrain as dc

    train(_micro_config(tmp_path, steps=2, token_shift=True))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert config["input_token_shift"] is True
    assert {"model.transformer.shift_prev.weight", "model.transformer.shift_next.weight"} <= set(tensors)
    [result] = dc.LLM(str(tmp_path / "out")).generate(["Request: x\nAnswer: "], max_new_tokens=8, block_length=4)
    assert len(result.canvas_ids) == 8


def test_a_run_initialised_from_a_checkpoint_starts_at_its_function_with_a_wider_token_shift(tmp_path):
    """--init-from DIR --token-shift-left 3: the new run loads the checkpoint's weights and tokenizer, its extra
    shift taps start at zero (same logits as the checkpoint before any step), and its export carries them."""
    import dllm_constrain as dc
    from dllm_constrain.train.trainer import build_model, init_from_checkpoint

    train(_micro_config(tmp_path / "a", steps=2, token_shift=True))
    wide = _micro_config(tmp_path / "b", steps=2, token_shift=True, token_shift_left=3,
                         init_from=str(tmp_path / "a" / "out"))
    model = build_model(wide).eval()
    tok = init_from_checkpoint(model, tmp_path / "a" / "out")
    assert tok.get_vocab() == Tokenizer.from_file(str(tmp_path / "a" / "out" / "tokenizer.json")).get_vocab()
    before = dc.LLM(str(tmp_path / "a" / "out")).model
    ids = torch.tensor([[0, 40, 41, 42, 43, 3, 3, 44]])
    with torch.no_grad():
        assert torch.allclose(model(ids), before(ids))
    train(wide)
    config = json.loads((tmp_path / "b" / "out" / "config.json").read_text())
    tensors = load_file(str(tmp_path / "b" / "out" / "model.safetensors"))
    assert config["token_shift_left"] == 3
    assert {"model.transformer.shift_prev2.weight", "model.transformer.shift_prev3.weight"} <= set(tensors)
    assert tensors["model.transformer.shift_prev3.weight"].abs().sum() > 0  # trained, not left at zero


def test_a_run_initialised_from_a_shallower_checkpoint_starts_at_its_function(tmp_path):
    """--init-from DIR --n-layers deeper: the inserted blocks are copies of their left neighbour with zero output
    projections, so before any step the grown model gives the checkpoint's logits; training then moves them."""
    import dllm_constrain as dc
    from dllm_constrain.train.trainer import build_model, init_from_checkpoint

    train(_micro_config(tmp_path / "a", steps=2, token_shift=True, n_layers=2))
    shallow = json.loads((tmp_path / "a" / "out" / "config.json").read_text())["n_layers"]
    deep = _micro_config(tmp_path / "b", steps=2, token_shift=True, n_layers=shallow + 2,
                         init_from=str(tmp_path / "a" / "out"))
    model = build_model(deep).eval()
    init_from_checkpoint(model, tmp_path / "a" / "out")
    before = dc.LLM(str(tmp_path / "a" / "out")).model
    ids = torch.tensor([[0, 40, 41, 42, 43, 3, 3, 44]])
    with torch.no_grad():
        assert torch.allclose(model(ids), before(ids), atol=1e-5)
    train(deep)
    tensors = load_file(str(tmp_path / "b" / "out" / "model.safetensors"))
    assert json.loads((tmp_path / "b" / "out" / "config.json").read_text())["n_layers"] == shallow + 2
    assert all(tensors[f"model.transformer.blocks.{i}.attn_out.weight"].abs().sum() > 0 for i in range(shallow + 2))


def test_grown_blocks_are_spread_through_the_stack_after_the_block_they_copy():
    from dllm_constrain.train.trainer import grown_layer_sources

    assert grown_layer_sources(6, 8) == [(0, False), (1, False), (2, False), (2, True), (3, False), (4, False),
                                         (5, False), (5, True)]
    assert grown_layer_sources(4, 4) == [(i, False) for i in range(4)]
    for old in range(1, 7):
        for new in range(old, 2 * old + 1):
            sources = grown_layer_sources(old, new)
            assert len(sources) == new and [i for i, grown in sources if not grown] == list(range(old))
    with pytest.raises(ValueError, match="shrink"):
        grown_layer_sources(6, 4)
    with pytest.raises(ValueError, match="at most one"):
        grown_layer_sources(2, 5)


def test_the_report_draws_a_run_and_its_init_from_successor_as_one_run(tmp_path):
    from dllm_constrain.train.report import chain_logs

    train(_micro_config(tmp_path / "a", steps=4, token_shift=True))
    train(_micro_config(tmp_path / "b", steps=4, token_shift=True, token_shift_left=2,
                        init_from=str(tmp_path / "a" / "out")))
    steps, evals = chain_logs([tmp_path / "a" / "run" / "log.jsonl", tmp_path / "b" / "run" / "log.jsonl"])
    assert [r["step"] for r in steps] == list(range(8))
    assert [r["step"] for r in evals] == [4, 8]
    assert all(a["seconds"] <= b["seconds"] for a, b in zip(steps, steps[1:]))


def test_init_from_refuses_a_checkpoint_of_another_shape(tmp_path):
    from dllm_constrain.train.trainer import build_model, init_from_checkpoint

    train(_micro_config(tmp_path / "a", steps=1, token_shift=True))
    other = _micro_config(tmp_path / "b", token_shift=True, d_model=48)
    with pytest.raises(ValueError, match="does not fit|shape"):
        init_from_checkpoint(build_model(other), tmp_path / "a" / "out")


def test_a_copy_initialised_model_reads_out_the_tokens_it_attends_to_before_any_training():
    """copy_init: values, output projections and the LM head start as a copier, so an untrained model's guess at a
    masked position is a token of its context (a random start guesses any of the vocabulary)."""
    from dllm_constrain.train.trainer import build_model

    cfg = TrainConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=2, mlp_hidden_size=64, copy_init=True)
    model = build_model(cfg).eval()
    ids = torch.tensor([[0, 57, 57, 57, 57, 57, 3, 3]])  # BOS, one repeated token, two masked positions
    with torch.no_grad():
        guess = model.logits(model.hidden_states(ids)[0, 6:]).argmax(-1)
    assert guess.tolist() == [57, 57]
    random_start = build_model(TrainConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=2,
                                           mlp_hidden_size=64)).eval()
    with torch.no_grad():
        assert random_start.logits(random_start.hidden_states(ids)[0, 6:]).argmax(-1).tolist() != [57, 57]
    assert sorted(model.state_dict()) == sorted(random_start.state_dict())  # LLaDA's layout, only the start differs


def test_resume_refuses_a_different_architecture(tmp_path):
    train(_micro_config(tmp_path, steps=1))
    with pytest.raises(ValueError, match="d_model"):
        train(_micro_config(tmp_path, d_model=64, resume=True))


def test_answers_that_do_not_fit_the_canvas_are_dropped_not_truncated():
    from dllm_constrain.train.trainer import encode_examples

    tok = train_tokenizer((e["prompt"] + e["answer"] for e in ExampleGenerator(0).examples(300)), vocab_size=400)
    examples = [{"prompt": "Request: x\nAnswer: ", "answer": "a" * 10}, {"prompt": "Request: y\nAnswer: ",
                                                                            "answer": "word " * 200}]
    pairs = encode_examples(examples, tok, max_canvas=32)
    assert len(pairs) == 1 and tok.decode(pairs[0][1]) == "a" * 10


def test_the_exported_model_has_a_context_of_2048_tokens(micro_run):
    out, _ = micro_run
    assert json.loads((out / "config.json").read_text())["max_sequence_length"] >= 2048


def test_the_copy_probe_scores_every_stated_scalar_value_of_the_held_out_requests(micro_run):
    from dllm_constrain.train.heldout import copy_probe

    out, _ = micro_run
    probe = copy_probe(str(out), n=6)
    stated = [v for e in ExampleGenerator(HELDOUT_SEED, plain_text_share=0.0, split="heldout").examples(6)
              for v in e["stated"].values() if isinstance(v, (str, int, float)) and not isinstance(v, bool)]
    assert probe["values"] == len(stated) and probe["value_tokens"] >= len(stated)
    assert 0.0 <= probe["token_accuracy"] <= 1.0 and 0.0 <= probe["whole_value_accuracy"] <= 1.0
    assert 0.0 <= probe["left_to_right_value_accuracy"] <= 1.0
    assert 0.0 <= probe["first_token_accuracy"] <= 1.0 and 0.0 <= probe["later_token_accuracy"] <= 1.0


def test_the_unconstrained_held_out_figures_decode_with_the_checkpoint_defaults(micro_run, monkeypatch):
    """The unconstrained figures are what a user of the checkpoint gets: its generation_config.json (canvas, policy),
    not the engine's bare defaults."""
    from dllm_constrain.api import LLM, GenerationDefaults
    from dllm_constrain.train.heldout import evaluate

    out, _ = micro_run
    seen = []
    generate = LLM.generate

    def spy(self, *args, **kwargs):
        seen.append(self.defaults)
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(LLM, "generate", spy)
    evaluate(str(out), n=2, batch_size=2)
    expected = GenerationDefaults.from_folder(out)
    assert expected != GenerationDefaults()  # the test would not tell otherwise
    assert seen and all(d == expected for d in seen)


def test_a_sampled_held_out_evaluation_gives_the_same_answers_at_its_seed(micro_run):
    """Every request is sampled at the evaluation's seed (`sample_seed`, default `seed`): a run at temperature > 0
    repeats, another sampling seed draws other answers."""
    from dllm_constrain.train.heldout import evaluate

    out, _ = micro_run
    answers = [[r["answer"] for r in evaluate(str(out), n=4, batch_size=4, temperature=1.0, **seed)[1]]
               for seed in ({}, {}, {"sample_seed": 5})]
    assert answers[0] == answers[1]
    assert answers[2] != answers[0]


def test_the_held_out_figures_can_state_the_requests_in_the_training_phrasings(micro_run):
    """--phrasing train: same requests' values, training split's phrasings (what unseen phrasings cost is the gap)."""
    from dllm_constrain.train.data import ExampleGenerator
    from dllm_constrain.train.heldout import HELDOUT_SEED, evaluate
    from dllm_constrain.train.phrasing import HELDOUT

    out, _ = micro_run
    _, records = evaluate(str(out), n=4, batch_size=2, phrasing="train")
    expected = ExampleGenerator(HELDOUT_SEED, plain_text_share=0.0, split="train").examples(4)
    assert [r["request"] for r in records] == [e["request"] for e in expected]
    assert not any(r["request"].startswith(lead) for lead in HELDOUT.leads for r in records)


def test_the_held_out_script_passes_a_block_length_to_generation(micro_run, monkeypatch, capsys):
    from dllm_constrain.api import LLM
    from dllm_constrain.train.heldout import main

    out, _ = micro_run
    seen = []
    generate = LLM.generate

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("block_length"))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(LLM, "generate", spy)
    main(["--model", str(out), "--n", "2", "--batch-size", "2", "--block-length", "1"])
    assert seen and all(b == 1 for b in seen)
    assert "field-value recall" in capsys.readouterr().out


def _answer_mask_rates(prefix_share: float) -> tuple[float, float]:
    """Masked fraction of the first and the last quarter of the answers, over many noised rows."""
    import random

    from dllm_constrain.train.trainer import make_batch

    cfg = TrainConfig(max_canvas=48, prefix_share=prefix_share)
    pairs = [([0, 5, 6, 7], list(range(10, 50)))] * 64
    first = last = 0.0
    gen = torch.Generator().manual_seed(0)
    for i in range(20):
        b = make_batch(pairs, cfg, random.Random(i), gen)
        answer = b["masked"][:, 4:4 + 40].float()
        first += answer[:, :10].mean().item() / 20
        last += answer[:, 30:].mean().item() / 20
    return first, last


def test_prefix_noising_keeps_the_start_of_the_answer_known_more_often_than_its_end():
    first, last = _answer_mask_rates(1.0)
    assert first < 0.6 * last


def test_uniform_noising_masks_the_start_and_the_end_of_the_answer_alike():
    first, last = _answer_mask_rates(0.0)
    assert abs(first - last) < 0.05


def test_value_spans_are_the_leaf_values_of_the_answer_never_its_keys():
    from dllm_constrain.train.trainer import value_spans

    answer = '{"name":"Ada \\"L\\"","age":36,"e":"","tags":["x",true],"o":{"k":null,"f":-1.5e3}}'
    assert [answer[a:b] for a, b in value_spans(answer)] == ['Ada \\"L\\"', "36", "x", "true", "null", "-1.5e3"]
    assert value_spans("SELECT name FROM users") == []


def test_value_noising_masks_each_value_whole_or_not_at_all():
    import random

    from dllm_constrain.train.trainer import encode_examples, make_batch

    tok = train_tokenizer((e["prompt"] + e["answer"] for e in ExampleGenerator(0).examples(300)), vocab_size=400)
    examples = [e for e in ExampleGenerator(5, plain_text_share=0.0).examples(24)]
    pairs = encode_examples(examples, tok, max_canvas=96)
    cfg = TrainConfig(max_canvas=96, value_share=1.0)
    gen = torch.Generator().manual_seed(0)
    partly = whole = 0
    for i in range(10):
        b = make_batch(pairs, cfg, random.Random(i), gen)
        plen = b["ids"].shape[1] - int(b["canvas"][0])
        for r, (_, answer, value_of) in enumerate(pairs):
            for k in set(value_of) - {-1}:
                m = [bool(b["masked"][r, plen + j]) for j, v in enumerate(value_of) if v == k]
                partly += any(m) and not all(m)
                whole += all(m)
    assert partly == 0 and whole > 0


def test_prefix_and_value_noising_run_together_on_encoded_examples():
    import random

    from dllm_constrain.train.trainer import encode_examples, make_batch

    tok = train_tokenizer((e["prompt"] + e["answer"] for e in ExampleGenerator(0).examples(300)), vocab_size=400)
    pairs = encode_examples(ExampleGenerator(5, plain_text_share=0.0).examples(16), tok, max_canvas=96)
    cfg = TrainConfig(max_canvas=96, prefix_share=0.5, value_share=0.5)
    b = make_batch(pairs, cfg, random.Random(0), torch.Generator().manual_seed(0))
    assert b["masked"].shape == b["ids"].shape and bool(b["masked"].any())


def test_the_answer_tokens_of_a_value_are_labelled_with_it_and_the_keys_with_none():
    from dllm_constrain.train.trainer import encode_examples

    tok = train_tokenizer((e["prompt"] + e["answer"] for e in ExampleGenerator(0).examples(300)), vocab_size=400)
    [(_, answer, value_of)] = encode_examples([{"prompt": "Request: x\nAnswer: ",
                                                "answer": '{"city":"Lima","age":7}'}], tok, max_canvas=32)
    text = {k: "".join(tok.decode([t]) for t, v in zip(answer, value_of) if v == k) for k in set(value_of)}
    assert "Lima" in text[0] and text[1] == "7" and "city" in text[-1] and "age" in text[-1]


def test_the_held_out_loss_uses_the_llada_noise_whatever_the_training_mix():
    from dllm_constrain.train.trainer import _new_run, heldout_loss

    base = dict(vocab_size=300, tokenizer_corpus=300, d_model=32, n_layers=1, n_heads=2, mlp_hidden_size=64,
                max_canvas=32, batch_size=4, eval_batches=2, threads=1)
    run = _new_run(TrainConfig(**base))
    plain = heldout_loss(run.model, run.tok, TrainConfig(**base))
    assert heldout_loss(run.model, run.tok, TrainConfig(**base, prefix_share=0.9, value_share=0.9)) == plain


def test_heldout_loss_of_an_exported_checkpoint_is_the_one_training_logged(tmp_path, capsys):
    from dllm_constrain.train.heldout import main as heldout_main
    from dllm_constrain.train.trainer import checkpoint_heldout_loss

    cfg = TrainConfig(out=str(tmp_path), run_dir=str(tmp_path / "run"), vocab_size=300, tokenizer_corpus=300,
                      d_model=32, n_layers=1, n_heads=2, mlp_hidden_size=64, max_canvas=32, batch_size=4, steps=6,
                      log_every=100, threads=1, eval_every=6, eval_batches=2)
    train(cfg)
    logged = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    [final] = [r["heldout_loss"] for r in logged if "heldout_loss" in r]
    assert checkpoint_heldout_loss(tmp_path, batches=2, batch_size=4, max_canvas=32) == pytest.approx(final, rel=1e-5)
    heldout_main(["--model", str(tmp_path), "--loss", "--loss-batches", "1"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["batches"] == 1 and printed["heldout_loss"] > 0
