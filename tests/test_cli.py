"""The command line: prints the answer, shows the denoising on a terminal, reports errors cleanly."""
from __future__ import annotations

import io
import subprocess
import sys

import pytest

import dllm_constrain as dc
from dllm_constrain.cli import OPEN, CanvasDisplay, main
from dllm_constrain.engine.llm_engine import CanvasSnapshot, StepEvent


def test_main_prints_the_same_answer_as_the_api(tiny_checkpoint, capsys) -> None:
    args = ["hello", "--model", str(tiny_checkpoint), "--max-new-tokens", "8", "--block-length", "4",
            "--no-progress"]
    assert main(args) == 0
    expected = dc.generate("hello", model=str(tiny_checkpoint), max_new_tokens=8, block_length=4)
    assert capsys.readouterr().out == expected + "\n"


def test_every_option_is_passed_through(tiny_checkpoint, capsys) -> None:
    args = ["hi", "--model", str(tiny_checkpoint), "--max-new-tokens", "8", "--steps", "4", "--block-length", "4",
            "--policy", "threshold", "--threshold", "0.5", "--temperature", "0.7", "--seed", "3", "--stats"]
    assert main(args) == 0
    expected = dc.generate("hi", model=str(tiny_checkpoint), max_new_tokens=8, steps=4, block_length=4,
                           policy="threshold", threshold=0.5, temperature=0.7, seed=3)
    captured = capsys.readouterr()
    assert captured.out == expected + "\n"
    assert "nfe=" in captured.err and "tokens_per_forward=" in captured.err


def test_bad_input_exits_with_status_2_and_a_one_line_error(tiny_checkpoint, capsys) -> None:
    assert main(["hi", "--model", str(tiny_checkpoint), "--max-new-tokens", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "max_new_tokens" in err


def test_a_schema_that_is_neither_a_file_nor_json_is_a_one_line_error(capsys) -> None:
    assert main(["hi", "--schema", "{not json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and "not valid JSON" in err and "line 1 column 2" in err


def test_a_schema_file_with_malformed_json_shows_the_decode_error_with_line_and_column(tmp_path, capsys) -> None:
    bad = tmp_path / "schema.json"
    bad.write_text('{\n  "type": "object",\n  "properties": {"a": {"type": "integer"},}\n}\n', encoding="utf-8")
    assert main(["hi", "--schema", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: --schema {bad}: the file is not valid JSON: ") and "line 3 column 43" in err, err


def test_a_missing_schema_file_is_named_in_the_error(capsys) -> None:
    assert main(["hi", "--schema", "no_such_schema.json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no file 'no_such_schema.json'" in err, err


def test_stats_report_backtracks(tiny_checkpoint, capsys) -> None:
    args = ["hi", "--model", str(tiny_checkpoint), "--max-new-tokens", "8", "--block-length", "4", "--no-progress",
            "--regex", "[0-9]{2,4}", "--stats"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "backtracks=0" in err and "remasks=" in err and "forced_tokens=" in err, err


def test_a_file_given_as_the_model_is_a_one_line_checkpoint_error(tmp_path, capsys) -> None:
    f = tmp_path / "config.json"
    f.write_text("{}")
    assert main(["hi", "--model", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "is a file, not a checkpoint folder" in err and err.count("\n") == 1


def test_the_display_draws_open_positions_as_blocks_and_stops_at_the_answer_end() -> None:
    display = CanvasDisplay(lambda ids: "".join(chr(ord("a") + i) for i in ids), io.StringIO())
    display.eos_id = 99
    canvas = [0, 3, 1, 99, 99, 2]
    assert display.render(canvas, [True, False, True, False, False, False], 3) == f"a{OPEN}b{OPEN * 3}"
    assert display.render(canvas, [True, True, True, True, True, True], 3) == "adb"


def test_the_display_redraws_one_line_per_step() -> None:
    stream = io.StringIO()
    display = CanvasDisplay(lambda ids: "x" * len(ids), stream)
    event = StepEvent(step=1, snapshots=[CanvasSnapshot(0, [5, 3], [True, False], False)], mask_id=3)
    display(event)
    assert stream.getvalue().startswith("\r\x1b[2K") and stream.getvalue().endswith(f"x{OPEN}")


def test_python_dash_m_runs_the_cli(tiny_checkpoint) -> None:
    """The module entry point works as a subprocess (progress off: stderr is not a terminal)."""
    proc = subprocess.run(
        [sys.executable, "-m", "dllm_constrain", "hi", "--model", str(tiny_checkpoint), "--max-new-tokens", "4",
         "--block-length", "4"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


@pytest.mark.parametrize("argv", [["--help"], ["hi", "--max-new-tokens", "many"], ["hi", "--policy", "best"]])
def test_help_and_argument_errors_answer_without_importing_torch(argv) -> None:
    """Parsing is light: the model's modules (torch) load only once the arguments are read."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "dllm_constrain", *argv], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == (0 if argv == ["--help"] else 2), proc.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert imported and "dllm_constrain.cli" in imported
    assert not [name for name in imported if name.split(".")[0] == "torch"]


def test_the_sampling_flags_state_the_sampling_params_fields_types_defaults_and_choices() -> None:
    import typing
    from dataclasses import fields

    from dllm_constrain.cli import CHOICES, SAMPLING_FLAGS
    from dllm_constrain.engine.state import POLICY_NAMES, SCHEDULES, SamplingParams

    hints = typing.get_type_hints(SamplingParams)
    by_name = {f.name: f for f in fields(SamplingParams)}
    for name, (_, kind, default) in SAMPLING_FLAGS.items():
        assert by_name[name].default == default, name
        assert kind in (typing.get_args(hints[name]) or (hints[name],)), name
    assert tuple(CHOICES["policy"]) == POLICY_NAMES and tuple(CHOICES["schedule"]) == SCHEDULES


def test_kv_cache_memory_takes_a_size_and_bounds_the_kv_memory_at_admission(capsys) -> None:
    from dllm_constrain.cli import build_parser, field_options
    from dllm_constrain.engine.config import EngineConfig

    options = field_options(build_parser().parse_args(["hi", "--kv-cache-memory", "512MiB"]))
    assert options == {"kv_cache_memory": 512 << 20}
    config = EngineConfig().with_overrides(**options)
    assert config.kv_cache_memory == config.kv_budget_bytes == 512 << 20
    assert EngineConfig(kv_cache_memory=1 << 30, kv_budget_bytes=1 << 20).kv_budget_bytes == 1 << 20  # given: kept
    assert main(["hi", "--kv-cache-memory", "lots"]) == 2  # before any model loads
    err = capsys.readouterr().err
    assert err.startswith("error: --kv-cache-memory") and "'lots'" in err
