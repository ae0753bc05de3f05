"""Device registry import from a SLURM-style ``topology.conf`` / ``gres.conf`` pair (pure text parsing).

``topology.conf`` (tree plugin): ``SwitchName=s0 Nodes=node[01-04] LinkSpeed=100`` and
``SwitchName=top Switches=s[0-1]``. ``gres.conf``: ``NodeName=node[01-02] Name=gpu Type=a100
File=/dev/nvidia[0-3]`` (or ``Count=4``). SLURM leaves ``LinkSpeed`` unit-free; here it is read as
Gbit/s. Memory and compute are not in these files, so they come from ``RegistryDefaults``.

Each node becomes a ``cpu`` device ``<node>``; each GPU a ``gpu`` device ``<node>/gpu<i>``. Links:
host↔GPU (PCIe), GPU↔GPU on one node (NVLink-class), host↔host through the switch tree (latency
grows with the switches on the path, bandwidth is the slowest switch's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from node.workload.errors import InvalidObject
from node.workload.model import Device, Link

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_EXPANDED = 100_000


@dataclass(frozen=True)
class RegistryDefaults:
    """What SLURM's files do not say: capacities, compute and link characteristics."""

    host_memory_bytes: int = 256 * 2**30
    host_flops: float = 2e12
    gpu_memory_bytes: dict[str, int] = field(default_factory=lambda: {
        "a100": 80 * 2**30, "h100": 80 * 2**30, "h200": 141 * 10**9, "v100": 32 * 2**30})
    gpu_flops: dict[str, float] = field(default_factory=lambda: {
        "a100": 312e12, "h100": 989e12, "h200": 989e12, "v100": 125e12})
    unknown_gpu_memory_bytes: int = 16 * 2**30
    pcie_latency_ns: int = 1_000
    pcie_bandwidth: float = 32e9
    nvlink_latency_ns: int = 500
    nvlink_bandwidth: float = 300e9
    switch_latency_ns: int = 1_500
    default_link_gbps: float = 100.0


def expand_hostlist(expr: str) -> list[str]:
    """Return the names of a SLURM hostlist such as ``node[01-03,07],login1``."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", expr.strip()):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if match is None:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        if "[" in suffix:
            raise InvalidObject("more than one bracketed range per name is not supported", obj=expr)
        for item in ranges.split(","):
            r = _RANGE.match(item)
            if r is None:
                raise InvalidObject(f"bad hostlist range {item!r}", obj=expr)
            lo, hi = r.group(1), r.group(2) or r.group(1)
            if int(hi) < int(lo) or int(hi) - int(lo) > MAX_EXPANDED:
                raise InvalidObject(f"bad hostlist range {item!r}", obj=expr)
            names.extend(f"{prefix}{str(i).zfill(len(lo))}{suffix}" for i in range(int(lo), int(hi) + 1))
    if len(names) > MAX_EXPANDED:
        raise InvalidObject("hostlist too long", obj=expr[:80])
    return names


def parse_conf_lines(text: str) -> list[dict[str, str]]:
    """Return each non-comment line of a SLURM conf file as a key=value dict (keys lower-cased)."""
    rows: list[dict[str, str]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        row: dict[str, str] = {}
        for token in line.split():
            if "=" not in token:
                raise InvalidObject(f"line {number}: expected key=value, got {token!r}", obj=f"line {number}")
            key, value = token.split("=", 1)
            row[key.lower()] = value
        rows.append(row)
    return rows


@dataclass(frozen=True)
class SwitchTree:
    """The switch hierarchy: each node's leaf switch and each switch's parent and link speed."""

    node_switch: dict[str, str]
    parent: dict[str, str]
    speed_gbps: dict[str, float]

    def path_to_root(self, switch: str) -> list[str]:
        """Return the switches from one switch up to the root."""
        path = [switch]
        while path[-1] in self.parent:
            path.append(self.parent[path[-1]])
            if len(path) > len(self.parent) + 1:
                raise InvalidObject("switch cycle", obj=switch)
        return path

    def switches_between(self, a: str, b: str) -> list[str]:
        """Return the switches a message between two nodes passes."""
        up_a, up_b = self.path_to_root(self.node_switch[a]), self.path_to_root(self.node_switch[b])
        common = next((s for s in up_a if s in set(up_b)), None)
        if common is None:
            raise InvalidObject(f"nodes {a} and {b} share no switch", obj=f"{a}|{b}")
        return up_a[:up_a.index(common) + 1] + up_b[:up_b.index(common)]


def parse_topology(text: str, defaults: RegistryDefaults) -> SwitchTree:
    """Return the switch tree of a topology.conf."""
    node_switch: dict[str, str] = {}
    parent: dict[str, str] = {}
    speed: dict[str, float] = {}
    for row in parse_conf_lines(text):
        name = row.get("switchname")
        if not name:
            raise InvalidObject("every topology line needs SwitchName", obj=str(row))
        speed[name] = float(row.get("linkspeed", defaults.default_link_gbps))
        for node in expand_hostlist(row["nodes"]) if "nodes" in row else []:
            if node in node_switch:
                raise InvalidObject(f"node under two switches ({node_switch[node]}, {name})", obj=node)
            node_switch[node] = name
        for child in expand_hostlist(row["switches"]) if "switches" in row else []:
            parent[child] = name
    return SwitchTree(node_switch, parent, speed)


def parse_gres(text: str) -> dict[str, list[str]]:
    """Return each node's GPU types, one entry per GPU, from a gres.conf."""
    gpus: dict[str, list[str]] = {}
    for row in parse_conf_lines(text):
        if row.get("name", "").lower() != "gpu" or "nodename" not in row:
            continue
        if "file" in row:
            count = len(expand_hostlist(row["file"]))
        else:
            count = int(row.get("count", "1"))
        for node in expand_hostlist(row["nodename"]):
            gpus.setdefault(node, []).extend([row.get("type", "gpu").lower()] * count)
    return gpus


def compute_registry(topology_conf: str, gres_conf: str,
                     defaults: RegistryDefaults | None = None) -> tuple[list[Device], list[Link]]:
    """Return the devices and links described by a topology.conf / gres.conf pair."""
    d = defaults or RegistryDefaults()
    tree = parse_topology(topology_conf, d)
    gpus = parse_gres(gres_conf)
    unknown = sorted(set(gpus) - set(tree.node_switch))
    if unknown:
        raise InvalidObject(f"gres.conf names nodes not in topology.conf: {unknown[:5]}", obj=unknown[0])
    devices: list[Device] = []
    links: list[Link] = []
    nodes = sorted(tree.node_switch)
    for node in nodes:
        devices.append(Device(node, node, "cpu", d.host_memory_bytes, d.host_flops))
        ids = [f"{node}/gpu{i}" for i in range(len(gpus.get(node, [])))]
        for gpu_id, kind in zip(ids, gpus.get(node, []), strict=True):
            devices.append(Device(gpu_id, node, "gpu", d.gpu_memory_bytes.get(kind, d.unknown_gpu_memory_bytes),
                                  d.gpu_flops.get(kind, 0.0)))
            links.append(Link(node, gpu_id, d.pcie_latency_ns, d.pcie_bandwidth))
        links.extend(Link(a, b, d.nvlink_latency_ns, d.nvlink_bandwidth)
                     for i, a in enumerate(ids) for b in ids[i + 1:])
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            path = tree.switches_between(a, b)
            gbps = min(tree.speed_gbps.get(s, d.default_link_gbps) for s in path)
            links.append(Link(a, b, d.switch_latency_ns * len(path), gbps * 1e9 / 8))
    return devices, links
