"""The SLURM import is strict: every malformed file is a typed error naming its file and line, never a crash."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from node.cli_workload import workload_app
from node.workload.devices import ImportLimits, compute_registry, expand_hostlist, import_registry
from node.workload.errors import InvalidImport, InvalidObject, WorkloadError

TOPOLOGY = "SwitchName=s0 Nodes=node[01-02] LinkSpeed=200\nSwitchName=spine Switches=s0\n"
GRES = "NodeName=node[01-02] Name=gpu Type=h100 Count=2\n"


@pytest.mark.parametrize(("topology", "gres", "where", "message"), [
    ("SwitchName=s0 Nodes=n1 LinkSpeed=fast\n", "", "topology.conf:1", "LinkSpeed"),
    ("SwitchName=s0 Nodes=n1 LinkSpeed=nan\n", "", "topology.conf:1", "LinkSpeed"),
    ("SwitchName=s0 Nodes=n1 LinkSpeed=-5\n", "", "topology.conf:1", "LinkSpeed"),
    ("SwitchName=s0 Nodes=n1\n", "\nNodeName=n1 Name=gpu Count=two\n", "gres.conf:2", "whole number"),
    ("SwitchName=s0 Nodes=n1\n", "NodeName=n1 Name=gpu Count=100000000\n", "gres.conf:1", "outside"),
    ("SwitchName=s0 Nodes=n1\n", "NodeName=n1 Name=gpu Count=-3\n", "gres.conf:1", "whole number"),
    ("SwitchName=s0 Nodes=n1\n", "NodeName=n1 Name=gpu Count=0\n", "gres.conf:1", "outside"),
    ("SwitchName=s0 Nodes=node[01-02\n", "", "topology.conf:1", "unclosed"),
    ("SwitchName=s0 Nodes=node01-02]\n", "", "topology.conf:1", "without"),
    ("SwitchName=s0 Nodes=a,,b\n", "", "topology.conf:1", "empty name"),
    ("SwitchName=s0 Nodes=n1\n", "NodeName=n1 Nme=gpu Count=1\n", "gres.conf:1", "unknown key 'nme'"),
    ("SwitchName=s0 Nodes=n1\n", "NodeName=n1 Name=gpus Count=1\n", "gres.conf:1", "unknown gres Name"),
    ("SwitchName=s0 Nodes=n1\n", "Name=gpu Count=1\n", "gres.conf:1", "NodeName"),
    ("SwitchName=s0 Nodes=n1\n", "NodeName=n1 Name=gpu\n", "gres.conf:1", "File= or Count="),
    ("SwitchName=s0 Nodes=n1\n", "NodeName=n1 Name=gpu File=/dev/nvidia[0-1] Count=4\n", "gres.conf:1", "Count=4"),
    ("SwitchName=s0 Nodes=n1 Nodes=n2\n", "", "topology.conf:1", "twice"),
    ("SwitchName=s0 Nodes=n1 Speed=1\n", "", "topology.conf:1", "unknown key"),
    ("SwitchName=s0 Nodes=n1\nSwitchName=top Switches=s[0-1]\n", "", "topology.conf:2", "never defined"),
    ("SwitchName=s0 Nodes=n1\nSwitchName=s0 Nodes=n2\n", "", "topology.conf:2", "defined twice"),
    ("SwitchName=s0 Nodes=n[1-9999]\n", "", "topology.conf:1", "more than 1024"),
    ("SwitchName=s0 Nodes=n1\n", "NodeName=n1 Name=gpu Count=40\nNodeName=n1 Name=gpu Count=40\n", "gres.conf:2",
     "more than 64 GPUs"),
])
def test_malformed_files_are_typed_errors_naming_file_and_line(topology: str, gres: str, where: str,
                                                               message: str) -> None:
    with pytest.raises(InvalidImport, match=message) as info:
        import_registry(topology, gres)
    assert info.value.obj == where


def test_binary_and_oversized_files_are_refused() -> None:
    with pytest.raises(InvalidImport, match="UTF-8") as info:
        import_registry(bytes(range(256)) * 4, b"", topology_name="t.conf")
    assert info.value.obj == "t.conf"
    with pytest.raises(InvalidImport, match="control"):
        import_registry(b"SwitchName=s0 Nodes=n1\x00\n", b"")
    with pytest.raises(InvalidImport, match="over"):
        import_registry(b"#" * (ImportLimits().max_bytes + 1), b"")


def test_a_huge_count_is_refused_without_growing_the_process() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(InvalidImport, match="outside"):
        import_registry("SwitchName=s0 Nodes=n1\n", "NodeName=n1 Name=gpu Count=100000000\n")
    with pytest.raises(InvalidImport, match="more than"):
        import_registry("SwitchName=s0 Nodes=n1\n", "NodeName=n1 Name=gpu File=/dev/nvidia[0-99999999]\n")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # kB: nothing was expanded


def test_non_gpu_gres_is_reported_not_skipped_silently() -> None:
    result = import_registry(TOPOLOGY, GRES + "NodeName=node01 Name=mps Count=100\n")
    assert result.ignored == ("gres.conf:2: Name=mps on 1 node(s) is not a device",)
    assert len([d for d in result.devices if d.kind == "gpu"]) == 4


def test_the_cli_refuses_each_bad_file_with_exit_2(tmp_path: Path) -> None:
    topo, gres = tmp_path / "topology.conf", tmp_path / "gres.conf"
    runner = CliRunner()
    for t, g, expect in ((TOPOLOGY.replace("200", "fast"), GRES, "topology.conf:1"),
                         (TOPOLOGY, GRES.replace("Count=2", "Count=two"), "gres.conf:1"),
                         (TOPOLOGY.replace("node[01-02]", "node[01-02"), GRES, "topology.conf:1")):
        topo.write_text(t)
        gres.write_text(g)
        out = runner.invoke(workload_app, ["import-devices", "--topology", str(topo), "--gres", str(gres),
                                           "--record", str(tmp_path / "rec")])
        assert out.exit_code == 2 and expect in out.output.replace("\n", ""), out.output
    topo.write_bytes(bytes(range(256)))
    out = runner.invoke(workload_app, ["import-devices", "--topology", str(topo), "--gres", str(gres),
                                       "--record", str(tmp_path / "rec")])
    assert out.exit_code == 2 and "UTF-8" in out.output, out.output
    topo.write_text(TOPOLOGY)
    gres.write_text(GRES)
    out = runner.invoke(workload_app, ["import-devices", "--topology", str(topo), "--gres", str(gres),
                                       "--record", str(tmp_path / "rec")])
    assert out.exit_code == 0 and "registered 6 devices" in out.output, out.output


CONF_ALPHABET = st.sampled_from(list("SwitchNameNodesLinkSpeedGresCountFileType=[]-,#0123456789 \n\t\x00é/gpu"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(CONF_ALPHABET, max_size=200), st.text(CONF_ALPHABET, max_size=200))
def test_fuzzed_text_gives_devices_or_a_typed_error(topology: str, gres: str) -> None:
    try:
        devices, _links = compute_registry(topology, gres)
    except WorkloadError:
        return
    assert len(devices) <= ImportLimits().max_nodes * (1 + ImportLimits().max_gpus_per_node)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_fuzzed_bytes_give_devices_or_a_typed_error(topology: bytes, gres: bytes) -> None:
    try:
        import_registry(topology, gres)
    except WorkloadError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 8)), min_size=1, max_size=5),
       st.floats(0.5, 1000))
def test_generated_clusters_import_exactly(racks: list[tuple[int, int]], speed: float) -> None:
    """A well-formed pair: one device per node and per GPU, every name and count as written."""
    topo, gres, nodes, gpus = [], [], 0, 0
    for r, (n, g) in enumerate(racks):
        topo.append(f"SwitchName=leaf{r} Nodes=r{r}n[{1:02d}-{n:02d}] LinkSpeed={speed!r}")
        gres.append(f"NodeName=r{r}n[{1:02d}-{n:02d}] Name=gpu Type=h100 File=/dev/nvidia[0-{g - 1}]")
        nodes, gpus = nodes + n, gpus + n * g
    topo.append(f"SwitchName=spine Switches=leaf[0-{len(racks) - 1}]")
    result = import_registry("\n".join(topo), "\n".join(gres))
    assert len(result.devices) == nodes + gpus and not result.ignored
    assert sum(d.kind == "gpu" for d in result.devices) == gpus


def test_hostlist_is_strict() -> None:
    assert expand_hostlist("node[01-03,07],login1") == ["node01", "node02", "node03", "node07", "login1"]
    for bad in ("node[01-02", "node]", "a,,b", "[1-2]", "n[1-2]x[3-4]", "n[a-b]", "n[[1]]", "n o"):
        with pytest.raises(InvalidObject):
            expand_hostlist(bad)
