"""Host-side fact gathering for `primectl preflight`: one stdlib-only script, one JSON object out.

primectl runs it as `python3 -c <this source> <json-args>` (like the deploy
agent), so nothing needs to be installed on a host first. It only reads: it
decides nothing. The controller turns these facts into pass/warn/fail
(primectl/checks/preflight.py), which keeps every threshold unit-testable.

Args: paths (disk free), model_path, ports, address, runtime_python,
runtime_dir, gpu (bool: query nvidia-smi, NVLink, IB, peermem, NUMA, XIDs).
"""

from __future__ import annotations

import json
import os
import platform
import pwd
import re
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

# Printed by the runtime's python: its version and every installed distribution.
RUNTIME_SNIPPET = (
    "import json,sys,importlib.metadata as m\n"
    "pk={}\n"
    "for d in m.distributions():\n"
    "    n=d.metadata['Name']\n"
    "    if n: pk[n.lower().replace('_','-')]=d.version\n"
    "print(json.dumps({'primectl_runtime':1,'python':'%d.%d.%d'%sys.version_info[:3],'packages':pk}))\n"
)


def _run(argv: list[str], timeout: float = 30) -> tuple[int, str, str]:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: timed out after {timeout:g}s"
    except OSError as exc:
        return 126, "", f"{argv[0]}: {exc}"
    return r.returncode, r.stdout, r.stderr


def _existing(path: str) -> str:
    """The path itself or its nearest existing ancestor (what a later mkdir -p would land on)."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and p != "/":
        p = os.path.dirname(p)
    return p


def disk(paths: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in paths:
        at = _existing(path)
        try:
            st = os.statvfs(at)
        except OSError as exc:
            out[path] = {"error": str(exc), "at": at}
            continue
        out[path] = {"at": at, "free": st.f_bavail * st.f_frsize, "total": st.f_blocks * st.f_frsize,
                     "dev": os.stat(at).st_dev}
    return out


def meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return {"total": out.get("MemTotal", 0), "available": out.get("MemAvailable", out.get("MemFree", 0))}


def model_dir(path: str) -> dict[str, Any]:
    if not path:
        return {}
    if not os.path.exists(path):
        return {"path": path, "exists": False}
    if not os.path.isdir(path):
        return {"path": path, "exists": True, "is_dir": False}
    size, files = 0, 0
    for root, _dirs, names in os.walk(path, followlinks=True):
        for n in names:
            try:
                size += os.stat(os.path.join(root, n)).st_size  # follows symlinks (HF cache blobs)
                files += 1
            except OSError:
                continue
    return {"path": path, "exists": True, "is_dir": True, "bytes": size, "files": files}


def _listening() -> dict[int, list[tuple[str, int]]]:
    """port -> [(local address, socket inode)] of every TCP socket in LISTEN state."""
    out: dict[int, list[tuple[str, int]]] = {}
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            with open(name) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":
                continue
            addr_hex, port_hex = fields[1].split(":")
            addr = "any" if set(addr_hex) == {"0"} else _addr(addr_hex, width)
            out.setdefault(int(port_hex, 16), []).append((addr, int(fields[9])))
    return out


def _addr(h: str, width: int) -> str:
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, bytes.fromhex(h)[::-1])
    raw = b"".join(bytes.fromhex(h[i:i + 8])[::-1] for i in range(0, 32, 8))
    text = socket.inet_ntop(socket.AF_INET6, raw)
    return text[7:] if text.startswith("::ffff:") else text


def _owners(inodes: set[int]) -> dict[int, dict[str, Any]]:
    """socket inode -> {pid, command} by scanning /proc/*/fd (root sees every process)."""
    found: dict[int, dict[str, Any]] = {}
    if not inodes:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                ino = int(target[8:-1])
                if ino in inodes and ino not in found:
                    try:
                        with open(f"/proc/{entry}/cmdline", "rb") as f:
                            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                    except OSError:
                        cmd = "?"
                    found[ino] = {"pid": int(entry), "command": cmd[:200]}
    return found


def ports(wanted: list[int], address: str) -> dict[str, Any]:
    """Each wanted port that something listens on at `address` (or on every address)."""
    listening = _listening()
    taken: dict[int, list[tuple[str, int]]] = {}
    for port in wanted:
        hits = [(a, ino) for a, ino in listening.get(port, []) if a in ("any", "::", address)]
        if not hits:
            s = socket.socket()
            s.settimeout(0.3)
            try:
                if s.connect_ex((address, port)) == 0:
                    hits = [(address, 0)]
            finally:
                s.close()
        if hits:
            taken[port] = hits
    owners = _owners({ino for hits in taken.values() for _, ino in hits if ino})
    out = {}
    for port, hits in taken.items():
        who = next((owners[ino] for _, ino in hits if ino in owners), None)
        out[str(port)] = {"address": hits[0][0], "pid": who["pid"] if who else None,
                          "command": who["command"] if who else None}
    return out


def runtime(python: str, runtime_dir: str) -> dict[str, Any]:
    if not python:
        return {}
    out: dict[str, Any] = {"python": python, "exists": os.path.exists(python)}
    try:
        with open(os.path.join(runtime_dir, ".primectl-runtime.stamp")) as f:
            out["stamp"] = f.read().split()[:1]
    except OSError:
        out["stamp"] = None
    if not out["exists"]:
        return out
    code, so, se = _run([python, "-c", RUNTIME_SNIPPET], timeout=60)
    out["code"] = code
    for line in reversed(so.strip().splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("primectl_runtime"):
                out["report"] = doc
                break
    if "report" not in out:
        out["output"] = (se or so).strip()[-800:]
    return out


def _csv(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split(",")] for line in text.strip().splitlines() if line.strip()]


GPU_FIELDS = ["index", "name", "pci.bus_id", "driver_version", "memory.total",
              "ecc.errors.uncorrected.volatile.total", "retired_pages.pending", "ecc.mode.current"]


def gpu() -> dict[str, Any]:
    smi = shutil.which("nvidia-smi") or ("/usr/bin/nvidia-smi" if os.path.exists("/usr/bin/nvidia-smi") else None)
    out: dict[str, Any] = {"nvidia_smi": smi}
    if smi:
        code, so, se = _run([smi, f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"])
        out["query_code"], out["query_error"] = code, se.strip()[-500:]
        out["gpus"] = [{k: row[i] if i < len(row) else "" for i, k in enumerate(GPU_FIELDS)} for row in _csv(so)] if code == 0 else []
        code, so, _ = _run([smi])
        m = re.search(r"CUDA Version:\s*([0-9.]+)", so)
        out["cuda_version"] = m.group(1) if m else None
        code, so, se = _run([smi, "nvlink", "-s"])
        out["nvlink_code"], out["nvlink"] = code, (so or se)[-20000:]
        code, so, _ = _run([smi, "topo", "-m"], timeout=20)
        out["topo"] = so[-4000:] if code == 0 else ""
    ib: list[dict[str, str]] = []
    base = "/sys/class/infiniband"
    if os.path.isdir(base):
        for dev in sorted(os.listdir(base)):
            pdir = os.path.join(base, dev, "ports")
            for port in sorted(os.listdir(pdir)) if os.path.isdir(pdir) else []:
                info = {"device": dev, "port": port}
                for key in ("state", "phys_state", "rate", "link_layer"):
                    try:
                        with open(os.path.join(pdir, port, key)) as f:
                            info[key] = f.read().strip()
                    except OSError:
                        info[key] = ""
                ib.append(info)
    out["ib"] = ib
    out["ibstat"] = bool(shutil.which("ibstat"))
    out["peermem"] = os.path.isdir("/sys/module/nvidia_peermem")
    nodes = sorted(int(n[4:]) for n in os.listdir("/sys/devices/system/node")
                   if re.fullmatch(r"node\d+", n)) if os.path.isdir("/sys/devices/system/node") else []
    out["numa_nodes"] = nodes
    gpu_numa: dict[str, int | None] = {}
    for g in out.get("gpus", []):
        bus = g.get("pci.bus_id", "").lower()
        # nvidia-smi prints an 8-digit domain (00000000:1B:00.0); sysfs uses 4 (0000:1b:00.0)
        if re.fullmatch(r"[0-9a-f]{8}:.*", bus):
            bus = bus[4:]
        try:
            with open(f"/sys/bus/pci/devices/{bus}/numa_node") as f:
                gpu_numa[g.get("index", "?")] = int(f.read().strip())
        except (OSError, ValueError):
            gpu_numa[g.get("index", "?")] = None
    out["gpu_numa"] = gpu_numa
    code, so, se = _run(["dmesg", "--notime"], timeout=10)
    if code == 0:
        xids = [line.strip()[:200] for line in so.splitlines() if "NVRM: Xid" in line]
        out["xid"] = {"readable": True, "count": len(xids), "last": xids[-3:]}
    else:
        out["xid"] = {"readable": False, "error": se.strip()[-200:]}
    return out


def main(argv: list[str]) -> int:
    a = json.loads(argv[1])
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    sudo: bool | None = None
    if uid != 0:
        sudo = _run(["sudo", "-n", "true"], timeout=10)[0] == 0
    os_name = ""
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    facts: dict[str, Any] = {
        "ok": True, "uid": uid, "user": user, "sudo": sudo, "os": os_name or platform.system(),
        "kernel": platform.release(), "python3": ".".join(map(str, sys.version_info[:3])), "time": time.time(),
        "disk": disk(a.get("paths", [])), "mem": meminfo(), "model": model_dir(a.get("model_path", "")),
        "ports": ports(a.get("ports", []), a.get("address", "127.0.0.1")),
        "runtime": runtime(a.get("runtime_python", ""), a.get("runtime_dir", "")),
    }
    if a.get("gpu"):
        facts["gpu"] = gpu()
    sys.stdout.write(json.dumps(facts) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
