"""Run at start-up by every Python process the real-SGLang suite starts (the suite puts this
folder on PYTHONPATH): the torchvision stand-in must be in place before SGLang is imported."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from sglang_support.standin import install

install()
