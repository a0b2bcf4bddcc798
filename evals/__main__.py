"""python -m dllm_constrain.evals ... (see evals/cli.py)."""
import sys

from .cli import main

sys.exit(main())
