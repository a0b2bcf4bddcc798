"""A request never reads a file the operator did not allow: the server's grammar fields and Lark `%import`.

Over HTTP a grammar is Lark text or a name (a shipped grammar, or one in the operator's `--grammar-dir`), never a
path; `%import` inside any grammar reaches only Lark's own library and the shipped grammars. Every refusal is a
400 with a typed error whose message says nothing of the file system (the same message whether a file exists or
not). The Python API's `load_grammar(path)` still reads files (its caller is the operator).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs fastapi (pip install fastapi uvicorn openai)")

from dllm_constrain.constraints.cfg import load_spec  # noqa: E402
from dllm_constrain.errors import InvalidGrammarError  # noqa: E402
from dllm_constrain.grammars import load_grammar  # noqa: E402
from dllm_constrain.serve.app import build_app  # noqa: E402
from dllm_constrain.serve.errors import GrammarNotAllowed  # noqa: E402
from dllm_constrain.serve.grammar_access import GrammarAccess  # noqa: E402
from serve_support import InstantBackend, post, running_server  # noqa: E402


@pytest.fixture(scope="module")
def llm() -> Any:
    import dllm_constrain as dc

    return dc.LLM()

SECRET = "topsecret-0451"
SECRET_GRAMMAR = f'start: SECRET\nSECRET: "{SECRET}"\n'


@pytest.fixture()
def host_files(tmp_path: Path) -> dict[str, Path]:
    """Files a hostile client might name: a .lark grammar outside any allowed directory, a text file, a binary
    file, and an operator directory with a grammar, a huge file, a binary file and a symlink out of it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.lark").write_text(SECRET_GRAMMAR)
    (outside / "notes.txt").write_text(f"{SECRET}\n")
    (outside / "blob.bin").write_bytes(bytes(range(256)) * 4)
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "digits.lark").write_text('start: /[0-9]+/\n')
    (allowed / "huge.lark").write_text("start: " + " | ".join(f'"{i}"' for i in range(200_000)) + "\n")
    (allowed / "binary.lark").write_bytes(b"start: \xff\xfe\x00\n")
    (allowed / "escape.lark").symlink_to(outside / "secret.lark")
    return {"outside": outside, "allowed": allowed, "secret": outside / "secret.lark"}


def _path_attacks(files: dict[str, Path]) -> list[str]:
    secret = str(files["secret"])
    return [secret, str(files["outside"] / "notes.txt"), str(files["outside"] / "blob.bin"), "/etc/passwd",
            "/proc/self/environ", "../outside/secret.lark", "./secret.lark", "~/secret.lark", "secret.lark",
            os.path.relpath(secret), "grammars/json.lark", "escape.lark", "escape", "huge", "binary", ".."]


# ---------------------------------------------------------------------------------------------- GrammarAccess
def test_grammar_text_and_shipped_names_resolve_without_the_file_system() -> None:
    access = GrammarAccess()
    assert access.resolve("json", "guided_grammar") == load_grammar("json")
    assert access.resolve("csv:4", "guided_grammar") == load_grammar("csv:4")
    assert access.resolve('start: "a"+', "guided_grammar") == 'start: "a"+\n'  # never a file name afterwards
    assert access.resolve('start: /[0-9]+/', "guided_grammar") == 'start: /[0-9]+/\n'


def test_every_path_is_refused_and_no_message_tells_whether_the_file_exists(host_files: dict[str, Path]) -> None:
    access = GrammarAccess(host_files["allowed"])
    for attack in _path_attacks(host_files):
        with pytest.raises(GrammarNotAllowed) as err:
            access.resolve(attack, "guided_grammar")
        assert SECRET not in err.value.message and "exist" not in err.value.message
        assert err.value.param == "guided_grammar" and err.value.status == 400
    messages = []
    for name in ("secret.lark", "no-such-file.lark"):  # one exists in the working directory, one nowhere
        cwd = os.getcwd()
        os.chdir(host_files["outside"])
        try:
            with pytest.raises(GrammarNotAllowed) as err:
                GrammarAccess().resolve(name, "grammar")
        finally:
            os.chdir(cwd)
        messages.append(err.value.message.replace(name, "NAME"))
    assert messages[0] == messages[1]


def test_the_operators_directory_serves_its_grammars_by_name_only(host_files: dict[str, Path]) -> None:
    access = GrammarAccess(host_files["allowed"])
    assert access.resolve("digits", "grammar") == "start: /[0-9]+/\n"
    assert access.resolve("digits.lark", "grammar") == "start: /[0-9]+/\n"
    for refused in ("huge", "binary", "escape", "../outside/secret", str(host_files["allowed"] / "digits.lark")):
        with pytest.raises(GrammarNotAllowed):
            access.resolve(refused, "grammar")


# ---------------------------------------------------------------------------------------------- %import
def test_import_of_a_grammar_in_the_working_directory_is_refused(host_files: dict[str, Path],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(host_files["outside"])
    for grammar in ("start: SECRET\n%import secret.SECRET\n", "start: SECRET\n%import .secret.SECRET\n",
                    "start: X\n%import outside.secret.X\n"):
        with pytest.raises(InvalidGrammarError) as err:
            load_spec(grammar)
        assert "no such grammar module" in str(err.value) and SECRET not in str(err.value)


def test_a_missing_import_is_an_invalid_grammar_not_an_os_error() -> None:
    with pytest.raises(InvalidGrammarError, match="no such grammar module"):
        load_spec("start: X\n%import nowhere_at_all.X\n")


def test_imports_from_larks_library_and_the_shipped_grammars_still_work() -> None:
    assert "NUMBER" in load_spec("start: NUMBER\n%import common.NUMBER\n").type_names
    assert load_spec("start: value\n%import json.value\n%import common.WS\n%ignore WS\n").n_states > 0


def test_the_python_api_reads_files_and_refuses_binary_ones_with_a_typed_error(host_files: dict[str, Path]) -> None:
    assert load_grammar(str(host_files["secret"])) == SECRET_GRAMMAR  # the operator's own call: allowed
    binary = host_files["outside"] / "binary.lark"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InvalidGrammarError, match="not UTF-8"):
        load_grammar(str(binary))


# ---------------------------------------------------------------------------------------------- over HTTP
def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, _, text = post(url + "/completions", body)
    return status, json.loads(text)


def test_path_attacks_over_http_are_400s_without_file_content(host_files: dict[str, Path]) -> None:
    backend = InstantBackend()
    app = build_app(backend, grammars=GrammarAccess(host_files["allowed"]))
    with running_server(app) as url:
        for attack in _path_attacks(host_files):
            for field in ({"guided_grammar": attack}, {"structured_outputs": {"grammar": attack}}):
                status, answer = _post(url, {"prompt": "x", "max_tokens": 8, **field})
                assert status == 400, (attack, answer)
                error = answer["error"]
                assert error["code"] == "grammar_not_allowed" and SECRET not in json.dumps(answer)
                expected = "guided_grammar" if "guided_grammar" in field else "structured_outputs.grammar"
                assert error["param"] == expected
        status, answer = _post(url, {"prompt": "x", "max_tokens": 8, "guided_grammar": "csv:many"})
        assert status == 400 and (answer["error"]["code"], answer["error"]["param"]) == ("invalid_grammar",
                                                                                         "guided_grammar")
        status, _ = _post(url, {"prompt": "x", "max_tokens": 8, "guided_grammar": "digits"})
        assert status == 200
    assert [r.constraint.grammar for r in backend.requests] == ["start: /[0-9]+/\n"]  # the only one that got through


def test_a_cwd_import_over_http_is_a_400_invalid_grammar(llm: Any, host_files: dict[str, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from dllm_constrain.serve.backend import EngineBackend

    monkeypatch.chdir(host_files["outside"])
    with running_server(build_app(EngineBackend(llm))) as url:
        status, answer = _post(url, {"prompt": "x", "max_tokens": 8,
                                     "guided_grammar": "start: SECRET\n%import secret.SECRET\n"})
    assert status == 400 and answer["error"]["code"] == "invalid_grammar", answer
    assert SECRET not in json.dumps(answer) and answer["error"]["param"] == "guided_grammar"


# ---------------------------------------------------------------------------------------------- property
_SHIPPED_DIR = Path(load_grammar.__code__.co_filename).resolve().parent


@pytest.fixture()
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file the code under test opens (builtins.open and io.open), recorded."""
    import builtins
    import io

    seen: list[str] = []
    real_open = builtins.open

    def spy(file: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(io, "open", spy)
    return seen


def test_without_a_grammar_directory_no_field_value_opens_a_file_but_a_shipped_grammar(opened: list[str]) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    words = st.one_of(st.text(max_size=40), st.from_regex(r"[./~A-Za-z0-9_:-]{1,30}", fullmatch=True),
                      st.sampled_from(["/etc/passwd", "../x.lark", "json", "csv:3", "/proc/self/environ", "x.lark"]))

    @settings(max_examples=300, deadline=None)
    @given(words)
    def resolve_touches_only_shipped_files(value: str) -> None:
        opened.clear()
        try:
            text = GrammarAccess().resolve(value, "grammar")
        except (GrammarNotAllowed, InvalidGrammarError):
            pass
        else:
            assert "\n" in text  # grammar text, never something a later step could read as a file name
        assert all(Path(f).resolve().parent == _SHIPPED_DIR for f in opened), opened

    resolve_touches_only_shipped_files()


def test_the_grammar_directory_option_must_name_a_directory(tmp_path: Path) -> None:
    from dllm_constrain.serve.__main__ import parse_args

    assert parse_args(["--grammar-dir", str(tmp_path)]).grammar_dir == tmp_path
    with pytest.raises(SystemExit):
        parse_args(["--grammar-dir", str(tmp_path / "missing")])
    with pytest.raises(ValueError):
        GrammarAccess(tmp_path / "missing")
