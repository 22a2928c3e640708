"""Bridges over named upstream gaps, shipped into a release's `bridges/` directory and run by the host runtime.

Each module is standard-library only (the runtime venv has no primectl), says which gap it covers and
when to delete it, and has a test that fails once the gap is gone. They live apart from
`primectl.engines`, whose `vllm.py` and `mooncake.py` would shadow the real packages for a script run
from its own directory.
"""
