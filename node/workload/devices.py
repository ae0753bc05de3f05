"""Device registry import from a SLURM-style ``topology.conf`` / ``gres.conf`` pair (pure, strict text parsing).

``topology.conf`` (tree plugin): ``SwitchName=s0 Nodes=node[01-04] LinkSpeed=100`` and
``SwitchName=top Switches=s[0-1]``. ``gres.conf``: ``NodeName=node[01-02] Name=gpu Type=a100
File=/dev/nvidia[0-3]`` (or ``Count=4``). SLURM leaves ``LinkSpeed`` unit-free; here it is read as
Gbit/s. Memory and compute are not in these files, so they come from ``RegistryDefaults``.

Each node becomes a ``cpu`` device ``<node>``; each GPU a ``gpu`` device ``<node>/gpu<i>``. Links:
host↔GPU (PCIe), GPU↔GPU on one node (NVLink-class), host↔host through the switch tree (latency
grows with the switches on the path, bandwidth is the slowest switch's).

The parser is strict: an unknown key, a repeated key, a value that is not a number where one is
expected, a malformed host list, a count out of ``ImportLimits``, a line that is not UTF-8 text —
each raises ``InvalidImport`` naming the file and line. Nothing is skipped silently: gres lines of a
known non-GPU kind (``mps``, ``shard``, ``nic``) are returned in ``RegistryImport.ignored``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from node.workload.errors import InvalidImport, InvalidObject
from node.workload.model import Device, Link

_RANGE = re.compile(r"^(\d{1,9})(?:-(\d{1,9}))?$")
_NAME = re.compile(r"^[A-Za-z0-9_.:/+-]+$")  # one host-list item outside its brackets (File= paths included)
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # node and switch names (no '/' or '|': they build ids)
_COUNT = re.compile(r"^\d{1,12}$")
MAX_EXPANDED = 100_000
TOPOLOGY_KEYS = frozenset({"switchname", "switches", "nodes", "linkspeed"})
GRES_KEYS = frozenset({"nodename", "name", "type", "file", "count", "cores", "corespeccount", "links", "flags",
                       "multiplefiles"})
NON_DEVICE_GRES = frozenset({"mps", "shard", "nic"})  # known gres kinds that are not devices (reported, not devices)


@dataclass(frozen=True)
class ImportLimits:
    """Bounds on what one import may create (links grow with the square of nodes and of GPUs per node)."""

    max_bytes: int = 1 << 20
    max_lines: int = 10_000
    max_nodes: int = 1_024
    max_switches: int = 4_096
    max_gpus_per_node: int = 64
    max_link_gbps: float = 1e6


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


@dataclass(frozen=True)
class ConfLine:
    """One non-empty line of a conf file: where it is and its key=value pairs (keys lower-cased)."""

    source: str
    number: int
    values: dict[str, str]

    @property
    def where(self) -> str:
        """Return ``file:line`` for errors."""
        return f"{self.source}:{self.number}"


@dataclass(frozen=True)
class RegistryImport:
    """The devices and links of an import, and the lines that describe no device (with why)."""

    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    ignored: tuple[str, ...]


def expand_hostlist(expr: str, where: str = "", limit: int = MAX_EXPANDED) -> list[str]:
    """Return the names of a SLURM hostlist such as ``node[01-03,07],login1`` (at most limit names)."""
    obj = where or expr[:80]
    names: list[str] = []
    for part in _split_top_level(expr, obj):
        match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]*)\]([^\[\]]*)", part)
        if match is None:
            if "[" in part or "]" in part:
                raise InvalidImport(f"more than one bracketed range in {part!r} is not supported", obj=obj)
            _check_name(part, obj)
            names.append(part)
        else:
            prefix, ranges, suffix = match.groups()
            for piece in (prefix, suffix):
                if piece:
                    _check_name(piece, obj)
            if not prefix and not suffix:
                raise InvalidImport(f"a range without a name: {part!r}", obj=obj)
            for item in ranges.split(","):
                r = _RANGE.match(item)
                if r is None:
                    raise InvalidImport(f"bad hostlist range {item!r}", obj=obj)
                lo, hi = r.group(1), r.group(2) or r.group(1)
                if int(hi) < int(lo):
                    raise InvalidImport(f"bad hostlist range {item!r}", obj=obj)
                if len(names) + int(hi) - int(lo) + 1 > limit:
                    raise InvalidImport(f"hostlist names more than {limit}", obj=obj)
                names.extend(f"{prefix}{str(i).zfill(len(lo))}{suffix}" for i in range(int(lo), int(hi) + 1))
        if len(names) > limit:
            raise InvalidImport(f"hostlist names more than {limit}", obj=obj)
    return names


def _split_top_level(expr: str, obj: str) -> list[str]:
    """Split a host list at the commas outside brackets; unbalanced brackets and empty items are errors."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise InvalidImport(f"nested brackets in {expr!r}", obj=obj)
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InvalidImport(f"']' without '[' in {expr!r}", obj=obj)
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise InvalidImport(f"unclosed '[' in {expr!r}", obj=obj)
    parts.append("".join(current))
    if any(not p for p in parts):
        raise InvalidImport(f"empty name in host list {expr!r}", obj=obj)
    return parts


def _check_name(name: str, obj: str) -> None:
    if not _NAME.match(name):
        raise InvalidImport(f"bad name {name!r}", obj=obj)


def decode_conf(data: bytes | str, source: str, limits: ImportLimits | None = None) -> str:
    """Return a conf file's text: bounded size, UTF-8, no control bytes (a binary file is refused)."""
    lim = limits or ImportLimits()
    if isinstance(data, bytes):
        if len(data) > lim.max_bytes:
            raise InvalidImport(f"file is over {lim.max_bytes} bytes", obj=source)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidImport(f"not UTF-8 text (byte {exc.start})", obj=source) from exc
    else:
        text = data
        if len(text) > lim.max_bytes:
            raise InvalidImport(f"file is over {lim.max_bytes} characters", obj=source)
    for number, line in enumerate(text.split("\n"), 1):
        if any(not (c.isprintable() or c in "\t\r") for c in line):
            raise InvalidImport("control or non-printable character (a binary file?)", obj=f"{source}:{number}")
    return text


def parse_conf_lines(text: str, source: str = "conf", allowed: frozenset[str] | None = None,
                     limits: ImportLimits | None = None) -> list[ConfLine]:
    """Return each non-comment line of a SLURM conf file as key=value pairs; anything else is InvalidImport."""
    lim = limits or ImportLimits()
    text = decode_conf(text, source, lim)
    rows: list[ConfLine] = []
    for number, raw in enumerate(text.split("\n"), 1):
        if number > lim.max_lines:
            raise InvalidImport(f"more than {lim.max_lines} lines", obj=f"{source}:{number}")
        where = f"{source}:{number}"
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        values: dict[str, str] = {}
        for token in line.split():
            key, eq, value = token.partition("=")
            if not eq or not key or not value:
                raise InvalidImport(f"expected key=value, got {token[:40]!r}", obj=where)
            key = key.lower()
            if allowed is not None and key not in allowed:
                raise InvalidImport(f"unknown key {key!r} (known: {', '.join(sorted(allowed))})", obj=where)
            if key in values:
                raise InvalidImport(f"key {key!r} given twice", obj=where)
            values[key] = value
        rows.append(ConfLine(source, number, values))
    return rows


def _parse_count(value: str, where: str, what: str, limit: int) -> int:
    if not _COUNT.match(value):
        raise InvalidImport(f"{what} must be a whole number, got {value[:20]!r}", obj=where)
    count = int(value)
    if not 1 <= count <= limit:
        raise InvalidImport(f"{what} {count} is outside 1..{limit}", obj=where)
    return count


def _parse_speed(value: str, where: str, limit: float) -> float:
    try:
        speed = float(value)
    except ValueError:
        raise InvalidImport(f"LinkSpeed must be a number (Gbit/s), got {value[:20]!r}", obj=where) from None
    if not (math.isfinite(speed) and 0 < speed <= limit):
        raise InvalidImport(f"LinkSpeed {value[:20]!r} is outside (0, {limit:g}]", obj=where)
    return speed


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


def parse_topology(text: str, defaults: RegistryDefaults, source: str = "topology.conf",
                   limits: ImportLimits | None = None) -> SwitchTree:
    """Return the switch tree of a topology.conf (every child switch defined, every name well-formed)."""
    lim = limits or ImportLimits()
    node_switch: dict[str, str] = {}
    parent: dict[str, str] = {}
    speed: dict[str, float] = {}
    child_where: dict[str, str] = {}
    for row in parse_conf_lines(text, source, TOPOLOGY_KEYS, lim):
        name = row.values.get("switchname")
        if not name:
            raise InvalidImport("every topology line needs SwitchName", obj=row.where)
        if not _NODE.match(name):
            raise InvalidImport(f"bad switch name {name!r}", obj=row.where)
        if name in speed:
            raise InvalidImport(f"switch {name} defined twice", obj=row.where)
        if "nodes" not in row.values and "switches" not in row.values:
            raise InvalidImport(f"switch {name} has neither Nodes nor Switches", obj=row.where)
        speed[name] = _parse_speed(row.values["linkspeed"], row.where, lim.max_link_gbps) \
            if "linkspeed" in row.values else defaults.default_link_gbps
        if len(speed) > lim.max_switches:
            raise InvalidImport(f"more than {lim.max_switches} switches", obj=row.where)
        for node in expand_hostlist(row.values["nodes"], row.where, lim.max_nodes) if "nodes" in row.values else []:
            if not _NODE.match(node):
                raise InvalidImport(f"bad node name {node!r}", obj=row.where)
            if node in node_switch:
                raise InvalidImport(f"node {node} under two switches ({node_switch[node]}, {name})", obj=row.where)
            node_switch[node] = name
            if len(node_switch) > lim.max_nodes:
                raise InvalidImport(f"more than {lim.max_nodes} nodes", obj=row.where)
        for child in expand_hostlist(row.values["switches"], row.where, lim.max_switches) \
                if "switches" in row.values else []:
            if child in parent or child == name:
                raise InvalidImport(f"switch {child} has two parents or is its own", obj=row.where)
            parent[child] = name
            child_where[child] = row.where
    undefined = sorted(set(parent) - set(speed))
    if undefined:
        raise InvalidImport(f"switch {undefined[0]} is never defined (SwitchName=)", obj=child_where[undefined[0]])
    return SwitchTree(node_switch, parent, speed)


def parse_gres(text: str, source: str = "gres.conf", limits: ImportLimits | None = None,
               ignored: list[str] | None = None) -> dict[str, list[str]]:
    """Return each node's GPU types, one entry per GPU, from a gres.conf; non-GPU gres lines go to ignored."""
    lim = limits or ImportLimits()
    gpus: dict[str, list[str]] = {}
    for row in parse_conf_lines(text, source, GRES_KEYS, lim):
        v = row.values
        if "nodename" not in v:
            raise InvalidImport("every gres line needs NodeName (a per-node file is not supported)", obj=row.where)
        kind = v.get("name", "").lower()
        if kind in NON_DEVICE_GRES:
            nodes = expand_hostlist(v["nodename"], row.where, lim.max_nodes)
            if "count" in v:
                _parse_count(v["count"], row.where, "Count", 2**31)
            if ignored is not None:
                ignored.append(f"{row.where}: Name={kind} on {len(nodes)} node(s) is not a device")
            continue
        if kind != "gpu":
            raise InvalidImport(f"unknown gres Name {v.get('name', '')!r} (gpu, or {sorted(NON_DEVICE_GRES)})",
                                obj=row.where)
        gpu_type = v.get("type", "gpu").lower()
        if not _NODE.match(gpu_type):
            raise InvalidImport(f"bad GPU Type {gpu_type!r}", obj=row.where)
        count = None
        if "file" in v:
            count = len(expand_hostlist(v["file"], row.where, lim.max_gpus_per_node))
        if "count" in v:
            counted = _parse_count(v["count"], row.where, "Count", lim.max_gpus_per_node)
            if count is not None and counted != count:
                raise InvalidImport(f"Count={counted} but File names {count} devices", obj=row.where)
            count = counted
        if count is None:
            raise InvalidImport("a gpu line needs File= or Count=", obj=row.where)
        for node in expand_hostlist(v["nodename"], row.where, lim.max_nodes):
            held = gpus.setdefault(node, [])
            if len(held) + count > lim.max_gpus_per_node:
                raise InvalidImport(f"node {node} would have more than {lim.max_gpus_per_node} GPUs", obj=row.where)
            held.extend([gpu_type] * count)
    return gpus


def import_registry(topology_conf: str | bytes, gres_conf: str | bytes, defaults: RegistryDefaults | None = None, *,
                    topology_name: str = "topology.conf", gres_name: str = "gres.conf",
                    limits: ImportLimits | None = None) -> RegistryImport:
    """Return the devices and links of a topology.conf / gres.conf pair, and the gres lines that are no device."""
    d = defaults or RegistryDefaults()
    lim = limits or ImportLimits()
    tree = parse_topology(decode_conf(topology_conf, topology_name, lim), d, topology_name, lim)
    ignored: list[str] = []
    gpus = parse_gres(decode_conf(gres_conf, gres_name, lim), gres_name, lim, ignored)
    unknown = sorted(set(gpus) - set(tree.node_switch))
    if unknown:
        raise InvalidImport(f"gres.conf names nodes not in topology.conf: {unknown[:5]}", obj=unknown[0])
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
    return RegistryImport(tuple(devices), tuple(links), tuple(ignored))


def compute_registry(topology_conf: str | bytes, gres_conf: str | bytes,
                     defaults: RegistryDefaults | None = None) -> tuple[list[Device], list[Link]]:
    """Return the devices and links described by a topology.conf / gres.conf pair (see import_registry)."""
    result = import_registry(topology_conf, gres_conf, defaults)
    return list(result.devices), list(result.links)
