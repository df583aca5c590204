import os
import sys

# the test models (tests/torch/models.py) import as ``models``
sys.path.insert(0, os.path.dirname(__file__))
