"""Under torchrun every ``zerokit.train`` call runs in the worker's own process, on the world group the first call
joined; each call builds its mesh (and carves, and the strategy's own groups) anew. The call destroys them once
every rank is past it (zerokit/runtime/mesh.py ``destroy_groups_made_since``): five calls leave torch's registry of
live process groups (``_world.pg_map``) as the first found it, the world group alone, not 5 × the groups of one.

The five: zero3 (the mesh's axes), zeropp with hpZ (a carved secondary partition), ddp with expert parallelism (the
ep / edp groups), a two-stage pipeline with tied weights (a group the strategy gives the mesh) and zero3 again."""
import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zerokit.runtime.torchrun import TORCHRUN_VARIABLES

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CALLS = 5
REPORT = re.compile(r"RANK (\d) LIVE (\[[\d, ]*\]) MADE (\[[\d, ]*\])")

JOB = textwrap.dedent("""
    import os
    import sys
    from torch.distributed import distributed_c10d as c10d
    import zerokit

    tiny = dict(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2)
    runs = [(zerokit.tiny_gpt(**tiny), "zero3", {}),
            (zerokit.tiny_gpt(**tiny), "zeropp", {"zero_hpz_partition_size": 2}),
            (zerokit.tiny_gpt(**tiny, n_experts=2), "ddp", {"parallel": {"dp": 2, "ep": 2}}),
            (zerokit.tiny_gpt(**tiny, tie_weights=True), "pp", {"schedule": "1f1b", "micro_batches": 2,
                                                               "optimizer": "sgd"}),
            (zerokit.tiny_gpt(**tiny), "zero3", {})]
    live, made = [], []
    for workload, strategy, options in runs:
        before = c10d._world.group_count  # torch's count of the groups made (each one's name)
        zerokit.train(workload, strategy, world_size=2, steps=1, reference=False, track_peak=False, **options)
        live.append(len(c10d._world.pg_map))
        made.append(c10d._world.group_count - before)
    sys.stdout.write(f"RANK {os.environ['RANK']} LIVE {live} MADE {made}\\n")  # one write: the ranks share stdout
    sys.stdout.flush()
""")


def test_five_train_calls_leave_no_process_groups_behind(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES + ("MASTER_ADDR", "MASTER_PORT")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])})
    # --standalone: torchrun's agent binds a free port itself
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(job)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    # the ranks write to one stdout: each report is found by its pattern, wherever another rank's text lands
    reports = {int(r): (live, made) for r, live, made in REPORT.findall(done.stdout)}
    assert sorted(reports) == [0, 1], (done.stdout, done.stderr[-4000:])
    for rank in range(2):
        line = "RANK {} LIVE {} MADE {}".format(rank, *reports[rank])
        live, made = (ast.literal_eval(part) for part in reports[rank])
        assert live == [1] * CALLS, line  # the world group alone, after every call
        # each call made groups (torch's count of them grew): the mesh's pp and tp axes (one rank each) on every
        # call, more where carved (hpZ), for ep / edp, or made by the pipeline (its tied weights)
        assert len(made) == CALLS and all(n >= 2 for n in made), line
