"""Test setup for the kernels package.

``TRITON_INTERPRET=1`` must be in the environment before triton is imported, so
it is set here at conftest import time (unless the caller chose otherwise, e.g.
``TRITON_INTERPRET=0`` on a GPU machine).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))
