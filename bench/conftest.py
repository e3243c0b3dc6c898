import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "0")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (bench/gpu_suite.sh selects with -k gpu)")
