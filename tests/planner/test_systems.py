"""The planner's cluster is a named system of one table (zerokit.theory.systems) and says which: ``--gpu h100`` takes
the peak, memory and links together, single flags override a figure each, bandwidths in bytes per second under
1 MB/s are refused with the unit, and ``zerokit plan`` fits a terminal."""
import json

import pytest

from zerokit import plan
from zerokit.cli import build_parser, main
from zerokit.planner.render import WIDTH
from zerokit.theory import systems


def run(capsys, *argv):
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_figure_of_the_table_has_its_source():
    for table in (systems.LINKS, systems.GPUS, systems.SYSTEMS):
        for name, entry in table.items():
            assert entry.name == name and entry.source, name
    a100, h100 = systems.SYSTEMS["dgx-a100"], systems.SYSTEMS["dgx-h100"]
    # NVIDIA's datasheets: NVLink 600 and 900 GB/s both ways, one 200 / 400 Gb/s card per GPU
    assert (a100.intra.bandwidth, a100.inter.bandwidth) == (600e9 / 2, 200e9 / 8)
    assert (h100.intra.bandwidth, h100.inter.bandwidth) == (900e9 / 2, 400e9 / 8)
    assert systems.system("H100") is h100 and systems.system("dgx-a100") is a100
    with pytest.raises(ValueError, match=r"system='b200'; allowed: a GPU \(a100, h100, h200\) or a system "
                                         r"\(dgx-a100, dgx-h100"):
        systems.system("b200")


def test_the_default_system_is_named_in_the_output(capsys):
    code, out, _ = run(capsys, "--preset", "llama-7b", "--gpus", "16", "--no-advice")
    assert code == 0
    text = " ".join(out.split())  # a wrapped line read as one
    assert "system: DGX A100 — 8× A100 SXM4 80 GB, NVLink 3 inside a node, InfiniBand HDR 200 Gb/s between nodes" \
           in text
    assert "(the default; another: --gpu h100" in text
    assert "inter-node 25 GB/s per GPU, 10 µs per message (DGX A100: InfiniBand HDR 200 Gb/s)" in text


def test_gpu_h100_takes_peak_memory_and_links_together_and_flags_override_one_each(capsys):
    code, out, _ = run(capsys, "--preset", "llama-7b", "--gpus", "16", "--gpu", "h100", "--json", "--no-advice")
    assert code == 0
    data = json.loads(out)
    cluster = data["cluster"]
    assert cluster["system"] == "dgx-h100"
    assert (cluster["gpu_memory"], cluster["gpus_per_node"]) == (80e9, 8)
    assert (cluster["intra_bandwidth"], cluster["inter_bandwidth"], cluster["host_bandwidth"]) == (450e9, 50e9, 50e9)
    assert data["step_time_estimate"]["gpu_peak_flops"] == 989e12
    code, out, _ = run(capsys, "--preset", "llama-7b", "--gpus", "16", "--gpu", "h100", "--inter-bandwidth", "100",
                       "--gpu-peak", "500", "--gpu-memory", "94GB", "--no-advice")
    text = " ".join(out.split())
    assert code == 0 and "system: DGX H100" in text
    assert "given instead of its figures: gpu_memory, inter_bandwidth" in text
    assert "inter-node 100 GB/s per GPU, 10 µs per message (given)" in text
    assert "intra-node 450 GB/s per GPU each way, 3 µs per message (DGX H100: NVLink 4)" in text
    assert "peak 500 TFLOP/s per GPU" in text and "94 GB each" in text
    # the API alike: a GPU's name or a system's, figures given one by one
    p = plan(preset="llama-7b", gpus=16, system="pcie-10gbe")
    assert (p.cluster.intra_bandwidth, p.cluster.inter_bandwidth) == (25e9, 1.25e9)
    assert p.step_time.peak_flops == 312e12
    assert plan(preset="llama-7b", gpus=16, system="h100", gpu_peak="a100").step_time.peak_flops == 312e12
    with pytest.raises(SystemExit) as exit_:  # argparse's own error, with the choices
        main(["plan", "--preset", "llama-7b", "--gpu", "b200"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--gpu: invalid choice: 'b200'" in err and "'h100'" in err


def test_a_bandwidth_in_bytes_per_second_under_1_mb_is_refused_with_the_unit(capsys):
    with pytest.raises(ValueError, match=r"intra_bandwidth=450 is in bytes per second: under 1 MB/s, surely meant "
                                         r"as GB/s; write 450e9 for 450 GB/s"):
        plan(preset="llama-7b", intra_bandwidth=450)
    with pytest.raises(ValueError, match=r"host_bandwidth=25 is in bytes per second"):
        plan(params=7e9, host_bandwidth=25)
    assert plan(params=7e9, inter_bandwidth=1e6).cluster.inter_bandwidth == 1e6  # 1 MB/s: slow, but bytes
    code, _, err = run(capsys, "--preset", "llama-7b", "--inter-bandwidth", "0.0001")
    assert code == 2 and err.startswith("zerokit: error: --inter-bandwidth 0.0001: GB/s per GPU, at least 0.001")


@pytest.mark.parametrize("argv", [
    ["--preset", "llama-7b", "--gpus", "64", "--strategy", "zero3"],
    ["--preset", "llama3-70b", "--gpus", "64", "--parallel", "dp=2,tp=8,pp=4", "--micro-batches", "8",
     "--checkpointing", "full", "--gpu", "h100"],
    ["--preset", "mixtral-8x7b", "--gpus", "64", "--ep", "8", "--strategy", "zero1", "--checkpointing", "full"],
    ["--preset", "llama3-8b", "--gpus", "16", "--cp", "4", "--strategy", "zero2", "--offload", "optimizer",
     "--convention", "deepspeed"],
    ["--params", "7.5e9", "--gpus", "64", "--strategy", "hsdp"],
])
def test_plan_fits_a_terminal(capsys, argv):
    code, out, _ = run(capsys, *argv)
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, max(lines, key=len)
    assert sum(len(line) for line in lines if line.strip()) > 2000  # nothing left out: the whole table, wrapped


def test_the_cluster_flags_state_their_defaults():
    plan_parser = build_parser()._subparsers._group_actions[0].choices["plan"]
    helps = {a.option_strings[0]: a.help for a in plan_parser._actions if a.option_strings}
    assert "default: the system's, 8" in helps["--gpus-per-node"]
    assert "default: the system's, 300" in helps["--intra-bandwidth"]
    assert "default: the system's, 25" in helps["--inter-bandwidth"]
    assert "h100 (DGX H100)" in helps["--gpu"]
