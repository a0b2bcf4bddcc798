"""What the GPU tests share: the marks that skip them without CUDA (they are always collected, so CI proves they
import), and the tiny LLaDA checkpoint folder they load."""
from __future__ import annotations

import pytest
import torch

CUDA = torch.cuda.is_available()
GPU = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device (run benchmarks/gpu_check.sh)")]
