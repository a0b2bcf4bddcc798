"""Shared test set-up: the machine is small and shared, so every test runs single-threaded."""
from __future__ import annotations

import torch

torch.set_num_threads(1)
torch.set_flush_denormal(True)
