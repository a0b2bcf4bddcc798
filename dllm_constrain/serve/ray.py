"""python -m dllm_constrain.serve.ray --replicas N [Ray options] [the options of python -m dllm_constrain.serve]:
N replicas of the OpenAI-compatible server behind one endpoint on Ray Serve (serve/ray_serve.py, docs/scale-out.md).

Run it with `-m` only: this module's name is Ray's, so it must never be a script on sys.path."""
from __future__ import annotations

import sys

from dllm_constrain.serve.ray_cli import main

if __name__ == "__main__":
    sys.exit(main())
