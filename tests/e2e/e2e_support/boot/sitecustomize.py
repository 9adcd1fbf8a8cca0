"""Run at start-up by every Python process of the SGLang servers the end-to-end suite launches
(the suite puts this folder first on their PYTHONPATH): the torchvision and sgl_kernel stand-ins
and the CPU-only patches must be in place before SGLang is imported (see e2e_support/inside.py)."""

import os
import sys

_here = os.path.abspath(__file__)
_tests = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(_here))))
sys.path.insert(0, os.path.join(_tests, "sglang_real"))
sys.path.insert(0, os.path.join(_tests, "e2e"))
from e2e_support.inside import install  # noqa: E402
from sglang_support.standin import install as install_torchvision  # noqa: E402

install_torchvision()
install()
