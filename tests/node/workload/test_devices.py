"""SLURM-style topology.conf / gres.conf import."""

from __future__ import annotations

import pytest

from node.workload.devices import compute_registry, expand_hostlist
from node.workload.errors import InvalidObject

TOPOLOGY = """
# two leaf switches under one spine
SwitchName=s0 Nodes=node[01-02] LinkSpeed=200
SwitchName=s1 Nodes=node03 LinkSpeed=100
SwitchName=spine Switches=s[0-1] LinkSpeed=400
"""
GRES = """
NodeName=node[01-02] Name=gpu Type=h100 File=/dev/nvidia[0-3]
NodeName=node03 Name=gpu Type=a100 Count=2
NodeName=node03 Name=mps Count=100
"""


def test_expand_hostlist() -> None:
    assert expand_hostlist("node[01-03,07],login1") == ["node01", "node02", "node03", "node07", "login1"]
    assert expand_hostlist("/dev/nvidia[0-3]") == [f"/dev/nvidia{i}" for i in range(4)]
    with pytest.raises(InvalidObject):
        expand_hostlist("node[3-1]")


def test_registry_from_slurm_files() -> None:
    devices, links = compute_registry(TOPOLOGY, GRES)
    by_id = {d.device_id: d for d in devices}
    assert sorted(d for d in by_id if "/" not in d) == ["node01", "node02", "node03"]
    assert [d for d in by_id if d.startswith("node01/")] == [f"node01/gpu{i}" for i in range(4)]
    assert by_id["node03/gpu1"].memory_bytes == 80 * 2**30 and by_id["node03/gpu1"].kind == "gpu"
    link = {ln.link_id: ln for ln in links}
    same_leaf, across = link["node01|node02"], link["node01|node03"]
    assert across.latency_ns > same_leaf.latency_ns  # more switches on the path
    assert same_leaf.bandwidth_bytes_per_s == 200e9 / 8 and across.bandwidth_bytes_per_s == 100e9 / 8
    assert "node01/gpu0|node01/gpu3" in link and "node01/gpu0|node02/gpu0" not in link


def test_gres_for_an_unknown_node_is_rejected() -> None:
    with pytest.raises(InvalidObject, match="node09"):
        compute_registry(TOPOLOGY, "NodeName=node09 Name=gpu Count=1")
    with pytest.raises(InvalidObject, match="key=value"):
        compute_registry("SwitchName=s0 Nodes=a junk", "")
