"""The torch extra installs the CPU build the project is tested with."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.torch
def test_torch_cpu_build_shares_numpy_memory() -> None:
    import torch

    assert torch.__version__.startswith("2.13.0")
    assert not torch.cuda.is_available()
    array = np.arange(6, dtype=np.uint8).reshape(2, 3)
    tensor = torch.from_numpy(array)
    array[0, 0] = 42
    assert int(tensor[0, 0]) == 42
