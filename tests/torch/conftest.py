import os
import sys

# the test models (tests/torch/torch_models.py) import as ``torch_models``
sys.path.insert(0, os.path.dirname(__file__))
