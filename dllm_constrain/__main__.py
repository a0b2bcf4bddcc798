"""`python -m dllm_constrain "prompt" ...`: see dllm_constrain/cli.py."""
import sys

from dllm_constrain.cli import main

sys.exit(main())
