"""python -m dllm_constrain.train [--out DIR] [--run-dir DIR] [--resume] [--steps N] ...: train the bundled
model (see trainer.py)."""
from __future__ import annotations

import argparse
import dataclasses
import json

from dllm_constrain.train.trainer import TrainConfig, train


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dllm_constrain.train", description=__doc__)
    for f in dataclasses.fields(TrainConfig):
        flag = f"--{f.name.replace('_', '-')}"
        if isinstance(f.default, bool):
            parser.add_argument(flag, action="store_true", default=f.default)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default)
    args = parser.parse_args(argv)
    summary = train(TrainConfig(**vars(args)))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
