"""The real node_exporter's InfiniBand collector on a FAKE sysfs tree (tests/data/fake-sysfs: no HCA here).

The fake holds one HCA port as the kernel lays it out and in the formats procfs parses
(prometheus/procfs sysfs/class_infiniband.go): class/infiniband/mlx5_0/{fw_ver,board_id,hca_type} and
ports/1/{state "4: ACTIVE", phys_state "5: LinkUp", rate "400 Gb/sec (4X NDR)", counters/*, hw_counters/*}
(newer procfs requires hw_counters/ for mlx5_ devices). Writing "1: DOWN" into `state` is the fault the alert
latency benchmark injects. node_exporter binds a free port on 127.0.0.1: run inside `unshare --net`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.exposition import NODE_EXPORTER, get, node_exporter, parse, value

FAKE_SYSFS = REPO / "tests" / "data" / "fake-sysfs"
PORT = {"device": "mlx5_0", "port": "1"}

pytestmark = pytest.mark.skipif(not NODE_EXPORTER.exists(), reason="prometheus-node-exporter is not installed (make system)")


def test_a_port_going_down_shows_on_the_next_scrape(tmp_path: Path) -> None:
    sysfs = tmp_path / "sysfs"
    shutil.copytree(FAKE_SYSFS, sysfs)
    port_dir = sysfs / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    with node_exporter(f"--path.sysfs={sysfs}", "--collector.disable-defaults", "--collector.infiniband",
                       log=tmp_path / "node_exporter.log") as url:
        series = parse(get(url))
        assert value(series, "node_scrape_collector_success", collector="infiniband") == 1
        assert value(series, "node_infiniband_state_id", **PORT) == 4
        assert value(series, "node_infiniband_physical_state_id", **PORT) == 5
        assert value(series, "node_infiniband_link_downed_total", **PORT) == 0
        assert value(series, "node_infiniband_rate_bytes_per_second", **PORT) == 400e9 / 8

        (port_dir / "state").write_text("1: DOWN\n")
        (port_dir / "phys_state").write_text("3: Disabled\n")
        (port_dir / "counters" / "link_downed").write_text("1\n")
        series = parse(get(url))
        assert value(series, "node_infiniband_state_id", **PORT) == 1
        assert value(series, "node_infiniband_physical_state_id", **PORT) == 3
        assert value(series, "node_infiniband_link_downed_total", **PORT) == 1
