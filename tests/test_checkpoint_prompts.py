"""What an Instruct checkpoint folder gives a user: its chat template, its family's decoding defaults, its stop ids.

Facts checked (published by the checkpoints' authors): LLaDA-8B-Instruct prompts in Llama-3's layout, the BOS
`<|startoftext|>` written by the template, each turn `<|start_header_id|>role<|end_header_id|>\\n\\n text <|eot_id|>`,
the generation prompt `<|start_header_id|>assistant<|end_header_id|>\\n\\n`; its answers end at `<|eot_id|>` or
`<|endoftext|>` (the eos). Dream-v0-Instruct-7B prompts in ChatML (`<|im_start|>role\\n text <|im_end|>\\n`, a
default system message, the generation prompt `<|im_start|>assistant\\n`); eos `<|endoftext|>`, `<|im_end|>` ends a
turn, mask `<|mask|>`; it decodes with alg="entropy" on the linspace schedule over the whole answer.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import dllm_constrain as dc
from checkpoints import build_dream_instruct, build_llada, build_llada_instruct
from dllm_constrain.cli import main
from dllm_constrain.errors import InvalidRequestError
from dllm_constrain.serve.chat import ChatFormatter
from llm_fixtures import bundled, dream, llada  # noqa: F401 - module-scoped fixtures, used by name


def _id(llm: dc.LLM, token: str) -> int:
    tid = llm.tokenizer.token_to_id(token)
    assert tid is not None
    return tid


def test_a_checkpoint_with_a_chat_template_is_prompted_through_it(llada: dc.LLM, dream: dc.LLM) -> None:
    assert llada.prompt_format == dream.prompt_format == "chat"
    assert llada.format("Hi there") == ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                                        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert dream.format("Hi there") == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                                        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")


def test_the_rendered_template_is_encoded_without_a_second_bos(llada: dc.LLM) -> None:
    ids = llada.prompt_ids("Hi there")
    bos, eot = _id(llada, "<|startoftext|>"), _id(llada, "<|eot_id|>")
    assert ids[0] == bos and ids.count(bos) == 1 and ids.count(eot) == 1
    assert ids == llada.tokenizer.encode(llada.format("Hi there"), add_special=False)
    tail = llada.tokenizer.encode("<|start_header_id|>assistant<|end_header_id|>\n\n", add_special=False)
    assert ids[-len(tail):] == tail


def test_a_conversation_and_a_string_go_through_the_same_template(llada: dc.LLM) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    text = llada.format(messages)
    assert text.startswith("<|startoftext|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
    assert llada.format([{"role": "user", "content": "Hi"}]) == llada.format("Hi")
    one = dc.generate(messages, model=llada, max_new_tokens=8, steps=4)
    assert isinstance(one, str)
    assert llada.generate([messages], max_new_tokens=8, steps=4)[0].text == one


def test_bad_conversations_are_refused_with_a_typed_error(llada: dc.LLM) -> None:
    with pytest.raises(InvalidRequestError, match="no role"):
        llada.generate([{"content": "Hi"}])
    with pytest.raises(InvalidRequestError, match="only text content parts"):
        llada.generate([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}])
    with pytest.raises(InvalidRequestError, match="no message has text"):
        llada.generate([{"role": "user", "content": "  "}])


def test_raw_and_request_formats_stay_available(tmp_path: Path, llada: dc.LLM) -> None:
    raw = dc.LLM(llada.path, prompt_format="raw", freeze_gc_heap=False)
    assert raw.format("Hi there") == "Hi there"
    with pytest.raises(InvalidRequestError, match="needs a chat template"):
        raw.generate([{"role": "user", "content": "Hi"}])
    build_llada(tmp_path / "base")  # no tokenizer_config.json: no template
    base = dc.LLM(tmp_path / "base", freeze_gc_heap=False)
    assert base.prompt_format == "raw"
    with pytest.raises(InvalidRequestError, match="chat_template"):
        dc.LLM(tmp_path / "base", prompt_format="chat", freeze_gc_heap=False)
    assert dc.LLM(freeze_gc_heap=False).prompt_format == "request"  # the bundled model's own format


def test_family_defaults_llada_blocks_dream_whole_answer(llada: dc.LLM, dream: dc.LLM) -> None:
    assert (llada.defaults.policy, llada.defaults.schedule, llada.defaults.block_length) == ("quota", "uniform", 32)
    assert (dream.defaults.policy, dream.defaults.schedule) == ("entropy", "linspace")
    assert dream.defaults.block_length >= dream.model.max_sequence_length  # one block: the whole answer
    [res] = dream.generate("Hi", max_new_tokens=48, steps=48, kv_cache="none")
    assert res.nfe <= 48


def test_stop_ids_come_from_the_template_and_eos_lists(tmp_path: Path, llada: dc.LLM, dream: dc.LLM) -> None:
    assert _id(llada, "<|eot_id|>") in llada.defaults.stop_token_ids
    assert _id(dream, "<|im_end|>") in dream.defaults.stop_token_ids
    assert llada.model.special.eos_id == _id(llada, "<|endoftext|>")
    assert (dream.model.special.eos_id, dream.model.special.mask_id) == (_id(dream, "<|endoftext|>"),
                                                                         _id(dream, "<|mask|>"))
    listed = {"eos_token_id": [1, 7, 9]}
    build_llada_instruct(tmp_path, seed=3, generation_config=listed)
    llm = dc.LLM(tmp_path, freeze_gc_heap=False)
    assert {7, 9} <= set(llm.defaults.stop_token_ids)


def test_a_stop_id_ends_the_answer_before_it_and_saves_forwards(llada: dc.LLM) -> None:
    """Under full recompute the trajectory is the same until the stop: the answer is the unstopped one cut at the
    first occurrence of the stop id."""
    options = {"max_new_tokens": 24, "block_length": 8, "steps": 24, "preset": "reference"}
    [full] = llada.generate("Name Ada, age 36.", **options)
    stop = full.token_ids[5]
    [cut] = llada.generate("Name Ada, age 36.", stop_token_ids=[stop], **options)
    assert cut.token_ids == full.token_ids[:full.token_ids.index(stop)]
    assert cut.finish_reason == "eos" and cut.nfe < full.nfe


def test_the_reference_preset_sets_full_recompute_and_the_family_ranking(llada: dc.LLM) -> None:
    call = llada.processor.build("Hi", preset="reference")
    assert call.config.kv_cache == "none" and call.make_requests()[0].params.policy == "quota"
    call = llada.processor.build("Hi", preset="reference", kv_cache="dual")
    assert call.config.kv_cache == "dual"  # a given keyword wins over the preset
    assert llada.processor.build("Hi").config.kv_cache == "dual"  # the fast default
    with pytest.raises(InvalidRequestError, match="preset"):
        llada.generate("Hi", preset="exact")
    bundled = dc.LLM(freeze_gc_heap=False)  # its generation_config says "threshold": the reference ranks by quota
    assert bundled.processor.build("Hi", preset="reference").make_requests()[0].params.policy == "quota"


def test_the_server_chat_path_hands_the_messages_to_the_llm(llada: dc.LLM) -> None:
    messages = [{"role": "user", "content": "Hi there"}]
    prompt = ChatFormatter.for_llm(llada).render(messages)
    assert llada.prompt_ids(prompt) == llada.prompt_ids("Hi there")
    assert llada.generate(prompt, max_new_tokens=8, steps=4, seed=1)[0].token_ids == \
        llada.generate("Hi there", max_new_tokens=8, steps=4, seed=1)[0].token_ids


def test_the_cli_prompts_through_the_template(llada: dc.LLM, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["Hi there", "--model", str(llada.path), "--max-new-tokens", "12", "--steps", "6", "--no-progress"]
    assert main([*args, "--preset", "reference"]) == 0
    out = capsys.readouterr().out
    expected = llada.generate("Hi there", max_new_tokens=12, steps=6, preset="reference")[0].text
    assert out == expected + "\n"
    assert main([*args, "--prompt-format", "raw", "--preset", "reference"]) == 0
    raw = dc.LLM(llada.path, prompt_format="raw", freeze_gc_heap=False)
    assert capsys.readouterr().out == raw.generate("Hi there", max_new_tokens=12, steps=6,
                                                   preset="reference")[0].text + "\n"


def test_generation_config_fields_override_the_family(tmp_path: Path) -> None:
    build_dream_instruct(tmp_path, generation_config={"eos_token_id": 1, "max_new_tokens": 40, "block_length": 8})
    defaults = dc.LLM(tmp_path, freeze_gc_heap=False).defaults
    assert (defaults.max_new_tokens, defaults.block_length, defaults.schedule) == (40, 8, "linspace")
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == 1


def test_the_reference_preset_is_refused_for_a_family_without_a_reference_loop(tmp_path: Path) -> None:
    from checkpoints import build_diffusion_gemma

    llm = dc.LLM(build_diffusion_gemma(tmp_path), freeze_gc_heap=False)
    with pytest.raises(InvalidRequestError, match="diffusion_gemma"):
        llm.generate("Hi", max_new_tokens=8, preset="reference")


def test_a_template_that_trips_over_a_message_is_a_typed_error_not_a_crash() -> None:
    from dllm_constrain.chat_template import ChatTemplate

    template = ChatTemplate("{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}")
    with pytest.raises(InvalidRequestError, match="chat template refused"):
        template.render([{"role": "user", "content": "Hi"}])


def test_under_a_constraint_a_stop_id_that_is_content_does_not_cut_the_answer(bundled: dc.LLM) -> None:
    """A stop id ends a constrained answer only where the constraint accepts what stands before it: the answer's
    first token, given as a stop id, is content there (cutting at it would leave an invalid, empty answer)."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    prompt = "Create a record with name Ada Lovelace."
    [full] = bundled.generate(prompt, schema=schema, seed=0)
    [same] = bundled.generate(prompt, schema=schema, seed=0, stop_token_ids=[full.token_ids[0]])
    assert same.text == full.text and json.loads(same.text) == json.loads(full.text)
