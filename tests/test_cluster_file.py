"""`--cluster FILE`: the cluster YAML, its validation, and the cost model using its links."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.predict.cost import estimate_cost
from autotune.predict.trust import outside_range
from autotune.specs.cluster import load_cluster_file
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import load_model

CLUSTERS = Path(__file__).parent.parent / "search_spaces" / "clusters"


@pytest.mark.parametrize("name", ["dgx-h100", "pcie-a100", "dgx-b200"])
def test_shipped_cluster_files_load(name: str) -> None:
    file = load_cluster_file(CLUSTERS / f"{name}.yaml")
    assert file.gpus_per_node in (4, 8) and file.inter_node_bytes_per_s > 0


def test_dgx_h100_network_is_400_gbit_per_gpu_and_b200_is_never_measured() -> None:
    assert load_cluster_file(CLUSTERS / "dgx-h100.yaml").inter_node_bytes_per_s == 50e9
    assert ClusterSpec.make(8, None, str(CLUSTERS / "dgx-h100.yaml")).gpu.inter_node_bytes_per_s \
        == 50e9
    cluster = ClusterSpec.make(8, None, str(CLUSTERS / "dgx-b200.yaml"))
    assert any("never measured" in n for n in outside_range(load_model("gpt2-xl"), cluster))


def test_the_cost_model_uses_the_files_network(tmp_path: Path) -> None:
    model = load_model("gpt-7.5b")
    layout = Layout(tp=8, pp=1, dp=2, mbs=1, gbs=64, impl="te")
    steps = []
    for gbit in (100, 400, 1600):
        path = tmp_path / f"c{gbit}.yaml"
        path.write_text(f"gpu: h100-80gb\ngpus_per_node: 8\nnvlink_gb_per_s: 450\n"
                        f"inter_node_gbit_per_s: {gbit}\n")
        cluster = ClusterSpec.make(16, None, str(path))
        steps.append(estimate_cost(model, layout, cluster).step_time_s)
    assert steps[0] > steps[1] > steps[2]


_LINKS = "nvlink_gb_per_s: 450\ninter_node_gbit_per_s: 400\n"


@pytest.mark.parametrize(("text", "message"), [
    ("gpu: h100-80gb\ngpus_per_node: 8\nnvlink_gb_per_s: 450\n",
     "missing cluster field(s) inter_node_gbit_per_s"),
    (f"gpu: h100-80gb\ngpus_per_node: 0\n{_LINKS}",
     "gpus_per_node must be a positive integer, got 0"),
    (f"gpu: h100-80gb\ngpus_per_node: 8.0\n{_LINKS}",
     "gpus_per_node must be an integer, got 8.0"),
    ("gpu: h100-80gb\ngpus_per_node: 8\nnvlink_gb_per_s: .inf\ninter_node_gbit_per_s: 400\n",
     "nvlink_gb_per_s must be a finite number, got inf"),
    ("gpu: h100-80gb\ngpus_per_node: 8\nnvlink_gb_per_s: fast\ninter_node_gbit_per_s: 400\n",
     "nvlink_gb_per_s must be a number, got 'fast'"),
    # A float field given 0 wants a positive number (not "a positive integer").
    ("gpu: h100-80gb\ngpus_per_node: 8\nnvlink_gb_per_s: 0\ninter_node_gbit_per_s: 400\n",
     "nvlink_gb_per_s must be a positive number, got 0"),
    (f"gpu: h100-80gb\ngpus_per_node: 8\n{_LINKS}host_memory_gib: -1\n",
     "host_memory_gib must be a positive number, got -1"),
    # Above any real link: the bound every real read from a file has (inputs.bounds).
    ("gpu: h100-80gb\ngpus_per_node: 8\nnvlink_gb_per_s: 1.0e+300\ninter_node_gbit_per_s: 4\n",
     "nvlink_gb_per_s must be at most 1e+18, got 1e+300"),
    (f"gpu: 100\ngpus_per_node: 8\n{_LINKS}", "gpu must be a string, got 100"),
    (f"gpu: h100-80gb\ngpus_per_node: 8\n{_LINKS}x: 1\n", "unknown cluster field(s) x"),
    (f"gpu: h100-80gb\ngpu: h200\ngpus_per_node: 8\n{_LINKS}", "key 'gpu' is given twice"),
    (f"gpu: &g h100-80gb\nname: *g\ngpus_per_node: 8\n{_LINKS}",
     "aliases are not accepted"),
    ("[1, 2]\n", "expected a mapping"),
    ("", "expected a mapping"),
    ("gpu: [\n", "malformed YAML"),
])
def test_bad_cluster_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_cluster_file(path)
    assert str(info.value).startswith(f"cluster file {path}: ")
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p.write_bytes(b"\xff\xfe gpu: h100"), "is not UTF-8 text"),
    (lambda p: p.mkdir(), "is a folder, not a file"),
    (lambda p: None, "does not exist"),
    (lambda p: p.write_text("note: " + "x" * 300_000), "is larger than 256 KiB"),
    (os.mkfifo, "is a FIFO, not a regular file"),  # read_text() blocked on it for ever
])
def test_a_cluster_file_that_cannot_be_read_is_one_line_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, message: str) -> None:
    path = tmp_path / "cluster.yaml"
    make(path)
    assert main(["estimate", "gpt2", "--gpus", "8", "--cluster", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"autotune: error: cluster file {path}")
    assert message in err[0]


def test_a_cluster_files_gpu_must_be_in_the_table(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("gpu: tpu\ngpus_per_node: 8\nnvlink_gb_per_s: 450\n"
                    "inter_node_gbit_per_s: 400\n")
    with pytest.raises(ConfigError, match=r"cluster file .*bad.yaml: unknown GPU 'tpu'") as info:
        ClusterSpec.make(8, None, str(path))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("per_node", "used"), [
    (None, 4),   # the file's nodes
    (2, 2),      # part of each node: a job may use fewer
    (4, 4),
    (8, None),   # more than a node holds: refused in one line
])
def test_gpus_per_node_cannot_exceed_the_files_nodes(per_node: int | None,
                                                    used: int | None) -> None:
    path = str(CLUSTERS / "pcie-a100.yaml")
    if used is None:
        with pytest.raises(ConfigError, match="more than the 4 GPUs per node of cluster file"):
            ClusterSpec.make(8, gpus_per_node=per_node, gpu=path)
    else:
        assert ClusterSpec.make(8, gpus_per_node=per_node, gpu=path).gpus_per_node == used


def test_the_cli_refuses_more_gpus_per_node_than_the_file_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CLUSTERS / "pcie-a100.yaml")
    assert main(["estimate", "gpt2-xl", "--gpus", "8", "--gpus-per-node", "8",
                 "--cluster", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "more than the 4 GPUs per node" in err[0], err


# --cluster NAME, as --space NAME: a shipped cluster by name (the sweep's `--cluster dgx-h100`
# was "unknown GPU 'dgx-h100'"); a GPU name stays the GPU; an unknown name lists both.
@pytest.mark.parametrize(("value", "gpu", "per_node", "inter_node"), [
    ("dgx-h100", "h100-80gb", 8, 50e9),
    ("dgx-b200", "b200", 8, 50e9),
    ("pcie-a100", "a100-80gb", 4, 25e9 / 8),
    ("h100-80gb", "h100-80gb", 8, None),
])
def test_a_shipped_cluster_is_named_like_a_shipped_space(value: str, gpu: str, per_node: int,
                                                         inter_node: float | None) -> None:
    cluster = ClusterSpec.make(16, None, value)
    assert (cluster.gpu.name, cluster.gpus_per_node) == (gpu, per_node)
    if inter_node is not None:
        assert cluster.gpu.inter_node_bytes_per_s == inter_node


@pytest.mark.parametrize("value", ["dgx-h1000", "../clusters/dgx-h100", "", "clusters"])
def test_an_unknown_gpu_or_cluster_name_lists_both(value: str) -> None:
    with pytest.raises(ConfigError, match=r"unknown GPU .*; choose one of h200.*; or a cluster: "
                                          r"dgx-b200, dgx-h100, pcie-a100"):
        ClusterSpec.make(16, None, value)
