#!/usr/bin/env python3
"""The demo fleet's two sites, each a network namespace of its own with an sshd inside (`make demo-fleet`).

    scripts/demo_fleet_sites.py up                  # site a at 10.88.1.2, site b at 10.88.2.2 (idempotent)
    scripts/demo_fleet_sites.py lose a [--partition]  # SIGKILL every process of site a (its link cut first)
    scripts/demo_fleet_sites.py restore a           # link up and sshd back; then `primectl up recipes/demo-site-a.yaml`
    scripts/demo_fleet_sites.py down                # every process of both sites, the namespaces and links

recipes/demo-site-{a,b}.yaml reach their host over SSH with the key and known_hosts written under
.demo/fleet-sites/. Each site is joined to this machine by a veth pair on 10.88.<n>.0/30 (this side .1, the
site .2); `up` refuses when 10.88.0.0/16 is already in use here. Needs root. Processes are found by pid (the
site's by /proc/PID/ns/net), never by name.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.netns_sites import NET, Site, known_hosts, load, save, start_site, stop_all  # noqa: E402

ROOT = REPO / ".demo" / "fleet-sites"
RECORD = ROOT / "sites.json"
SITES = {"a": 1, "b": 2}


def _in_use() -> str | None:
    """Addresses or routes in NET.0.0/16 here that are not the demo's own sites."""
    out = subprocess.run(["ip", "-o", "route", "show", "to", "match", f"{NET}.0.0/16"],
                         capture_output=True, text=True).stdout
    foreign = [line for line in out.splitlines() if line.startswith(f"{NET}.") and "pctl-site" not in line]
    return "\n".join(foreign) or None


def up() -> int:
    """Start the sites that are not running; write the key and known_hosts the site recipes name."""
    running = {s.name: s for s in load(RECORD)}
    if not running:
        clash = _in_use()
        if clash:
            print(f"demo_fleet_sites: {NET}.0.0/16 is already routed here; the demo's sites would clash:\n{clash}",
                  file=sys.stderr)
            return 2
    sites: list[Site] = []
    for letter, number in SITES.items():
        name = f"site-{letter}"
        site = running.get(name) or start_site(ROOT / name, name, number)
        if name in running:
            site.restore()
        sites.append(site)
        save(RECORD, sites)
    known_hosts(ROOT / "known_hosts", sites)
    for s in sites:
        print(f"{s.name}: {s.address} (network namespace of pid {s.holder}, sshd on port 22)")
    return 0


def site(letter: str) -> Site | None:
    """The running site `letter`, or None (said on stderr)."""
    found = {s.name: s for s in load(RECORD)}.get(f"site-{letter}")
    if found is None:
        print(f"demo_fleet_sites: site {letter} is not running (run: scripts/demo_fleet_sites.py up)", file=sys.stderr)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["up", "down", "lose", "restore"])
    ap.add_argument("site", nargs="?", choices=sorted(SITES))
    ap.add_argument("--partition", action="store_true", help="lose: cut the site's link first (nothing answers)")
    args = ap.parse_args()
    if args.action == "up":
        return up()
    if args.action == "down":
        stop_all(load(RECORD))
        RECORD.unlink(missing_ok=True)
        return 0
    if args.site is None:
        ap.error(f"{args.action} needs a site: {', '.join(sorted(SITES))}")
    found = site(args.site)
    if found is None:
        return 1
    if args.action == "lose":
        if args.partition:
            found.partition()
        print(f"site {args.site}: {len(found.kill())} processes SIGKILLed"
              + (", its link cut" if args.partition else ""))
    else:
        found.restore()
        print(f"site {args.site}: link up, sshd listening; now: primectl up recipes/demo-site-{args.site}.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
