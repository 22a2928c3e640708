"""A FAKE sysfs InfiniBand tree for node_exporter's infiniband collector (no InfiniBand here): one port of one
HCA, whose state a benchmark or test flips to inject a link fault."""

from __future__ import annotations

from pathlib import Path

ACTIVE = ("4: ACTIVE", "5: LinkUp")
DOWN = ("1: DOWN", "3: Disabled")


def port_dir(root: Path, device: str = "mlx5_0", port: int = 1) -> Path:
    """The port's directory under the fake sysfs `root`."""
    return root / "class" / "infiniband" / device / "ports" / str(port)


def write_fake_ib(root: Path, device: str = "mlx5_0", port: int = 1) -> Path:
    """Create the fake tree (port ACTIVE, LinkUp, no errors) under `root`; the port's directory."""
    dev = root / "class" / "infiniband" / device
    dev.mkdir(parents=True, exist_ok=True)
    for name, value in (("board_id", "MT_0000000838"), ("fw_ver", "28.39.1002"), ("hca_type", "MT4129")):
        (dev / name).write_text(value + "\n")
    p = port_dir(root, device, port)
    (p / "counters").mkdir(parents=True, exist_ok=True)
    (p / "rate").write_text("400 Gb/sec (4X NDR)\n")
    for name in ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors", "port_xmit_discards",
                 "port_rcv_data", "port_xmit_data", "port_rcv_packets", "port_xmit_packets"):
        (p / "counters" / name).write_text("0\n")
    set_state(root, ACTIVE, device, port)
    return p


def set_state(root: Path, state: tuple[str, str], device: str = "mlx5_0", port: int = 1) -> None:
    """Write the port's `state` and `phys_state` (ACTIVE or DOWN). The counters stay as they are: a flap's
    link_downed would keep InfinibandLinkFlapping (a warning over 15 minutes) firing after the repair."""
    p = port_dir(root, device, port)
    (p / "state").write_text(state[0] + "\n")
    (p / "phys_state").write_text(state[1] + "\n")
