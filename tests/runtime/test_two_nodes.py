"""Two nodes on one machine, the way a cluster runs: two torchrun agents of two workers each, joined by a c10d
rendezvous, each as a user starts one on each machine::

    python -m torch.distributed.run --nnodes 2 --nproc-per-node 2 --node-rank N --rdzv-backend c10d \\
        --rdzv-endpoint 127.0.0.1:PORT tests/data/two_node_worker.py OUT MODE

(with c10d the rendezvous gives each agent its node rank, its workers' ``GROUP_RANK``: ``--node-rank`` is
what a user passes, not what they get; the workers report theirs). The test itself serves the rendezvous
store, on a port the kernel picks (no port to race for), and both agents join it as clients
(``--rdzv-conf is_host=0``), so that the agent a test kills takes no store with it.

One launch (``train``, ``--max-restarts 1``) gives: every rank's losses and parameters against the
single-process reference; the mesh's node layout (2 nodes, this rank's node = its ``GROUP_RANK``, the
intra- and inter-node groups, each checked by a sum over it, each booked on its tier of a two-tier link);
and a restart: one worker SIGKILLs itself mid-run, torchrun starts every worker again, they resume from
the last checkpoint and end with the uninterrupted run's losses. Another (``lose-node``) kills node 1's
agent mid-run: node 0's ranks end with zerokit's NodeLost naming node 1.

Each launch's processes carry an environment mark (as tests/runtime/test_process_census.py does), and a
launch ends only once no process with its mark is alive, polled for a bounded time.
"""
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist

from zerokit import theory
from zerokit.runtime.link import LINKS
from zerokit.runtime.nodes import NodeLost, describe_gone
from zerokit.runtime.node_loss import _started, alive_here, knock, machine
from zerokit.runtime.torchrun import TORCHRUN_VARIABLES

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "data" / "two_node_worker.py"
MARK = "ZEROKIT_TWO_NODES_MARK"
RUN = uuid.uuid4().hex[:12]
#: bounds, generous for a loaded two-core machine: a launch's whole run, the ranks' first steps, and the wait for
#: every process of a launch to be gone once its agents have exited
LAUNCH_S, RUNNING_S, GONE_S = 240.0, 180.0, 30.0
#: what the worker script's train mode runs (tests/data/two_node_worker.py)
STEPS, SAVE_EVERY, KILL_STEP = 6, 2, 3


def marked(mark: str) -> list:
    """The live processes carrying ``mark`` (zombies have exited)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:  # gone, or another user's
            pass
    return found


class Launch:
    """Two torchrun agents (nodes) on one rendezvous store served here, their output in files under ``out``."""

    def __init__(self, tmp: Path, mode: str, max_restarts: int = 0):
        self.out = tmp / mode
        self.out.mkdir()
        self.mark = f"{RUN}-{mode}"
        # the rendezvous store: served by this process on a port the kernel picks; the agents join as clients
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
        env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES + ("MASTER_ADDR", "MASTER_PORT")}
        env.update({MARK: self.mark, "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])})
        self.agents = []
        for node in (0, 1):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                   "--node-rank", str(node), "--max-restarts", str(max_restarts), "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"127.0.0.1:{self.store.port}", "--rdzv-id", self.mark,
                   "--rdzv-conf", "is_host=0", str(WORKER), str(self.out), mode]
            with open(self.out / f"agent-{node}.out", "w") as out, open(self.out / f"agent-{node}.err", "w") as err:
                self.agents.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err))

    def read(self, what: str, rank: int) -> dict:
        return json.loads((self.out / f"{what}-{rank}.json").read_text())

    def err(self, node: int) -> str:
        return (self.out / f"agent-{node}.err").read_text()

    def wait(self, timeout_s: float = LAUNCH_S) -> list:
        """Both agents' exit codes; fails (everything killed) if they run past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        for agent in self.agents:
            try:
                agent.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                self.stop()
                pytest.fail(f"the agents ran past {timeout_s:g} s\n{self.err(0)[-3000:]}\n{self.err(1)[-3000:]}")
        return [agent.returncode for agent in self.agents]

    def left_behind(self) -> list:
        """What of this launch is still alive ``GONE_S`` after its agents exited (then killed, and listed)."""
        deadline = time.monotonic() + GONE_S
        while (left := marked(self.mark)) and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        return [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left if p.is_running()]

    def stop(self) -> None:
        for p in marked(self.mark):
            try:
                p.kill()
            except psutil.Error:
                pass
        for agent in self.agents:
            agent.wait()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The ``train`` launch, run to its end: its exit codes, and what is left behind."""
    launch = Launch(tmp_path_factory.mktemp("two_nodes"), "train", max_restarts=1)
    try:
        codes = launch.wait()
    finally:
        left = launch.left_behind()
    yield launch, codes, left


def test_two_agents_train_as_one_process(trained):
    launch, codes, left = trained
    assert codes == [0, 0], (codes, launch.err(0)[-3000:], launch.err(1)[-3000:])
    assert not left, left
    for rank in range(4):
        run = launch.read("uninterrupted", rank)
        assert run["param_diff"] is not None and run["param_diff"] <= 1e-5, run["param_diff"]
        assert run["losses"] == pytest.approx(run["reference_losses"], rel=1e-5)
    assert len({json.dumps(launch.read("uninterrupted", r)["losses"]) for r in range(4)}) == 1  # one report


def test_the_mesh_knows_the_nodes(trained):
    launch, codes, _ = trained
    assert codes == [0, 0]
    facts = [launch.read("facts", rank) for rank in range(4)]
    # the c10d rendezvous numbered the agents: each one's workers share a GROUP_RANK, ranks numbered node by node
    assert [f["env"]["GROUP_RANK"] for f in facts] == [0, 0, 1, 1]
    assert [f["env"]["LOCAL_RANK"] for f in facts] == [0, 1, 0, 1]
    for rank, f in enumerate(facts):
        node = f["env"]["GROUP_RANK"]
        assert (f["nodes"], f["node"], f["ranks_per_node"]) == (2, node, f["env"]["LOCAL_WORLD_SIZE"]), f
        assert f["node_ranks"] == [2 * node, 2 * node + 1]
        assert f["inter_node_ranks"] == [rank % 2, rank % 2 + 2]
        assert f["spans"] == {"node": False, "inter_node": True, "dp": True}
        # each group's sum of ranks: the group really holds those ranks
        assert f["sums"] == {"node": float(4 * node + 1), "inter_node": float(2 * (rank % 2) + 2), "dp": 6.0}
        # the two-tier link: inside the node on nvlink, across on 10 GbE, each the α-β formula for its ring
        tiers = {r["axis"]: r for r in f["records"]}
        assert {axis: r["link"] for axis, r in tiers.items()} == {"node": "nvlink", "inter_node": "10gbe",
                                                                   "dp": "10gbe"}
        for r in tiers.values():
            link = LINKS[r["link"]]
            assert r["emulated_s"] == pytest.approx(theory.link_seconds(
                r["ring_cost_bytes"], theory.ring_steps("all_reduce", r["group_size"]), link.bandwidth_Bps,
                link.alpha_s))


def test_a_restart_resumes_from_the_last_checkpoint(trained):
    launch, codes, _ = trained
    assert codes == [0, 0]
    assert (launch.out / "killed").exists(), "no worker was killed: the run did not restart"
    last = f"step-{(KILL_STEP // SAVE_EVERY) * SAVE_EVERY:06d}"
    for rank in range(4):
        whole, resumed = launch.read("uninterrupted", rank), launch.read("resumed", rank)
        assert resumed["resumed_from"] is not None and resumed["resumed_from"].endswith(last), resumed
        assert resumed["losses"] == pytest.approx(whole["losses"], rel=1e-12)
        start = int(last[len("step-"):])
        for mine, theirs in zip(resumed["rank_losses"], whole["rank_losses"]):
            assert mine[start:] == theirs[start:]  # the steps run again after the restart: the same, bit for bit
    named = [x for x in (launch.err(0) + launch.err(1)).splitlines() if "zerokit.runtime.nodes.NodeLost: " in x]
    # the ranks left named the one that died (and its node-mate, when its agent had stopped it by then)
    assert named and all("rank 3 of node 1 is gone" in x or "node 1 (ranks 2, 3) is gone" in x for x in named), named


def test_a_lost_node_ends_the_others_with_its_name(tmp_path):
    launch = Launch(tmp_path, "lose-node")
    try:
        deadline = time.monotonic() + RUNNING_S
        while not all((launch.out / f"running-{r}.json").exists() for r in range(4)):
            codes = [a.poll() for a in launch.agents]
            assert None in codes and time.monotonic() < deadline, \
                f"the ranks never all ran: {codes}\n{launch.err(0)[-3000:]}\n{launch.err(1)[-3000:]}"
            time.sleep(0.05)
        running = [launch.read("running", r) for r in range(4)]
        assert [r["group_rank"] for r in running] == [0, 0, 1, 1]
        agents = {a.pid: i for i, a in enumerate(launch.agents)}
        lost = agents[running[2]["agent"]]  # the agent of node 1: whichever of the two the rendezvous numbered 1
        assert running[3]["agent"] == running[2]["agent"] and running[0]["agent"] != running[2]["agent"]
        killed_at = time.monotonic()
        launch.agents[lost].send_signal(signal.SIGKILL)
        codes = launch.wait()
        took = time.monotonic() - killed_at
    finally:
        left = launch.left_behind()
    assert not left, left
    assert codes[lost] == -signal.SIGKILL and codes[1 - lost] == 1, codes
    err = launch.err(1 - lost)
    # the first rank left to find the loss says which node is gone and where it stopped (its agent then stops
    # the other one, SIGTERM, which may not have said so yet); torchrun's summary gives it as the root cause
    said = [x for x in err.splitlines() if x.startswith(("[rank0]: ", "[rank1]: ")) and "NodeLost: " in x]
    assert said and all("NodeLost: node 1 (ranks 2, 3) is gone" in x and "This rank" in x for x in said), err[-4000:]
    cause = err[err.index("Root Cause"):]
    assert "NodeLost: node 1 (ranks 2, 3) is gone" in cause, cause
    assert took < 60, took  # the process group's timeout is 30 s; a lost peer shows at once


def test_lost_ranks_are_named_by_node():
    assert describe_gone([3, 2], 2) == "node 1 (ranks 2, 3) is gone"
    assert describe_gone([3], 2) == "rank 3 of node 1 is gone"
    assert describe_gone([0, 4, 5, 6], 2) == ("rank 0 of node 0 is gone; node 2 (ranks 4, 5) is gone; "
                                              "rank 6 of node 3 is gone")
    error = NodeLost("node 1 (ranks 2, 3) is gone", [3, 2], 2)
    assert (error.gone, error.nodes) == ([2, 3], [1])


def test_a_knock_tells_a_live_process_from_a_gone_one():
    """A listening socket nobody reads answers (the kernel accepts into its backlog); a port nothing listens on
    refuses. The gone ones here stay bound, not listening, so that no other process can take their ports meanwhile."""
    import socket

    live, *gone = socket.socket(), socket.socket(), socket.socket()
    for sock in (live, *gone):
        sock.bind(("127.0.0.1", 0))
    live.listen(8)
    addresses = [sock.getsockname() for sock in (live, *gone)]
    try:
        assert knock(addresses, me=2) == [1]  # itself (rank 2) is never knocked on
        assert knock(addresses, me=0) == [1, 2]
    finally:
        for sock in (live, *gone):
            sock.close()


def test_a_rank_on_this_machine_is_asked_after_by_its_process_not_knocked_on():
    """On the knocker's own machine a gone rank's port may already serve another program (another job's gloo
    listener, mid-handshake), so a rank there is judged by its process: alive while that process (its id and start
    time) runs; gone once it exited, or when a later process took its id."""
    import subprocess
    import sys

    me = os.getpid()
    assert machine() and alive_here(me, _started(me))
    assert not alive_here(me, str(int(_started(me)) + 1))  # the same id, another start: a later process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = _started(child.pid)
    child.wait()
    assert not alive_here(child.pid, started) and not alive_here(child.pid, "")
