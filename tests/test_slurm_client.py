"""The Slurm client wrapper asks a query again when a signal ended it, and never repeats a command that changes
something. slurmctld dropping a client's connection (SIGPIPE) cannot be made to happen on purpose, so the
clients here are FAKE stand-ins on PATH: shell scripts that die of SIGPIPE the first time they run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from primectl.errors import DeployError
from primectl.targets.slurm_cli import SlurmClient, reads_only

FAKE = """#!/bin/sh
# FAKE {name}: the first call dies of SIGPIPE, as a client whose slurmctld connection was dropped does
echo "$0 $*" >> "{calls}"
if [ ! -e "{calls}.once" ]; then : > "{calls}.once"; kill -PIPE $$; fi
{answer}
"""


def _client(tmp_path: Path, name: str, answer: str) -> tuple[SlurmClient, Path]:
    calls = tmp_path / f"{name}.calls"
    script = tmp_path / name
    script.write_text(FAKE.format(name=name, calls=calls, answer=answer))
    script.chmod(0o755)
    return SlurmClient({**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}), calls


def test_a_query_a_signal_ended_is_asked_again(tmp_path: Path) -> None:
    client, calls = _client(tmp_path, "scontrol", "echo 'JobId=7 JobName=x JobState=RUNNING'")
    job = client.job("7")
    assert [c["JobState"] for c in job.components] == ["RUNNING"]
    assert len(calls.read_text().splitlines()) == 2


def test_a_submission_a_signal_ended_is_not_repeated(tmp_path: Path) -> None:
    client, calls = _client(tmp_path, "sbatch", "echo 12")
    with pytest.raises(DeployError, match="exit -13"):
        client.submit("job.sh", str(tmp_path))
    assert len(calls.read_text().splitlines()) == 1, "sbatch ran twice: the job could be submitted twice"


def test_only_queries_count_as_reads() -> None:
    assert reads_only(["squeue", "-h"]) and reads_only(["sinfo"]) and reads_only(["scontrol", "show", "job"])
    assert not reads_only(["scontrol", "update", "JobId=1"]) and not reads_only(["scancel", "1"])
    assert not reads_only(["sbatch", "x"])
