"""Device discipline, provable on the CPU: NCCL accepts only tensors on the rank's GPU, so every tensor zerokit
creates on a communication path is created on the rank's device.

An AST pass over the packages that communicate (the runtime, every parallelism, checkpoints, the own-loop API,
offload, the peers): every call of a torch tensor factory (torch.zeros, ones, empty, full, tensor, arange,
linspace, rand, randn, randint, as_tensor) passes ``device=``, or its line says why the tensor stays on the host
with a ``# host: …`` comment. ``*_like`` factories inherit their argument's device and are not flagged. The
pipeline's shape headers and loss report were CPU tensors handed to send/recv/broadcast: every pp > 1 run on
NCCL failed at its first step, and this test failed on them.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "zerokit"
FACTORIES = {"zeros", "ones", "empty", "full", "tensor", "arange", "linspace", "rand", "randn", "randint",
             "as_tensor"}
COMMUNICATING = ["runtime", "data_parallel", "zero", "tensor_parallel", "pipeline_parallel", "context_parallel",
                 "expert_parallel", "checkpoint", "checkpointing", "api", "offload", "peers"]


def _undeviced(path: Path) -> list:
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and not any(k.arg == "device" for k in node.keywords)
                and "# host:" not in lines[node.lineno - 1]):
            found.append(f"{path.parent.name}/{path.name}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_every_tensor_on_a_communication_path_is_made_on_the_ranks_device():
    files = [f for package in COMMUNICATING if (ROOT / package).is_dir() for f in sorted((ROOT / package).glob("*.py"))]
    assert len(files) > 40  # the packages are where they were
    found = [line for f in files for line in _undeviced(f)]
    assert not found, "tensor factories without device= (add it, or say why with '# host: …'):\n" + "\n".join(found)


def test_the_check_finds_a_factory_without_a_device(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text("import torch\nheader = torch.zeros(9, dtype=torch.int64)\nok = torch.zeros(9, device='cpu')\n"
                   "kept = torch.ones(2)  # host: a reason\nlike = torch.zeros_like(ok)\n")
    assert _undeviced(bad) == [f"{tmp_path.name}/probe.py:2: header = torch.zeros(9, dtype=torch.int64)"]
