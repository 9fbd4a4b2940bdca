"""The layer contract: zerokit's imports flow one way, down the floors, with no cycle.

Every module's imports are read with ``ast`` — those inside functions too — and resolved to
zerokit's modules. Importing ``zerokit.a.b`` runs ``zerokit/a/__init__.py`` first, so that
package counts as imported too. Three rules:

1. an import goes to a lower floor of :data:`FLOORS`, or along an arrow of :data:`BUILT_ON`
   (one piece of a floor built on another of the same floor);
2. no cycle between modules;
3. an import inside a function is there only to keep ``import zerokit`` light (the course,
   the grader, the planner, the bench, matplotlib load when used) and says so: ``# lazy``
   on its line. ``import zerokit`` leaves those packages out of ``sys.modules``.
"""
from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "zerokit"

#: bottom to top; a top-level module or package of zerokit by name (``zerokit`` is the package's own __init__)
FLOORS = [
    ("foundation: the process group, the ledgers, the formulas", {"runtime", "theory"}),
    ("what every parallelism shares: the strategy interface and registry, the optimizers, the report and its plots",
     {"strategies", "optim", "report", "plot"}),
    ("the parallelisms, one package per paper", {"data_parallel", "zero", "tensor_parallel", "pipeline_parallel",
                                                 "context_parallel", "expert_parallel", "offload",
                                                 "activation_checkpointing", "checkpointing", "checkpoint"}),
    ("the models they train (a mixture of experts, the tiny GPT's tensor-parallel plan)", {"workloads"}),
    ("the interfaces: torch's and DeepSpeed's verbs, the peers, the setup order, a job, the training loop",
     {"api", "peers", "parallelize", "job", "train", "config*"}),
    ("the applications", {"course", "grade", "tour", "tour_results", "bench", "planner", "cli"}),
    ("the package's face", {"zerokit"}),
]

#: arrows within a floor: (importer, imported) — the first is built on the second
BUILT_ON = {
    ("runtime", "theory"): "the ledgers price each collective by the formulas",
    ("strategies", "optim"): "a strategy steps a master optimizer",
    ("report", "plot"): "a report draws itself",
    ("zero", "data_parallel"): "ZeRO's stages are data parallelism's buckets, reducer and replica check, sharded",
    ("zero", "offload"): "ZeRO-Offload's host optimizer hooks into the stages",
    ("expert_parallel", "tensor_parallel"): "experts split by tensor parallelism (Megatron's expert tp)",
    ("checkpoint", "tensor_parallel"): "a checkpoint records and reshards tensor-parallel slices",
    ("checkpointing", "activation_checkpointing"): "the old name, an alias that re-exports the new package",
    ("peers", "api"): "torch's own wrappers, measured through the api's faces",
    ("parallelize", "config*"): "the setup order reads the run's configuration",
    ("job", "parallelize"): "a job applies the parallelisms in one order",
    ("job", "config*"): "a job is built from the configuration",
    ("job", "api"): "a job runs the engine every face runs",
    ("train", "job"): "the training loop runs a job",
    ("train", "api"): "the training loop drives the engine",
    ("train", "parallelize"): "the training loop's model, parallelized in one order",
    ("train", "config*"): "train() takes the configuration",
    ("api", "parallelize"): "the own-loop faces apply the same setup order",
    ("api", "config*"): "the own-loop faces take the same configuration",
    ("course", "planner"): "the course shows plans",
    ("tour_results", "tour"): "the tour's recorded results",
    ("cli", "tour"): "the command line runs the tour",
    ("cli", "tour_results"): "and reads its results back",
    ("cli", "bench"): "and the bench",
    ("cli", "grade"): "and the grader",
    ("cli", "planner"): "and the planner",
}

LAZY = "# lazy"

#: files whose imports inside functions (none of them closes a cycle) are still to move to the top; an entry goes
#: when its file has none left
NOT_YET_AT_THE_TOP: set = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def part_of(module: str) -> str:
    """The name FLOORS and BUILT_ON use for a module: its top-level package or module under zerokit."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "zerokit"


def key(part: str) -> str:
    """The FLOORS entry that names ``part`` (a pattern such as ``config*`` names several)."""
    for _, names in FLOORS:
        for name in names:
            if fnmatch.fnmatchcase(part, name):
                return name
    return ""


def floor(part: str) -> int:
    return next(i for i, (_, names) in enumerate(FLOORS) if key(part) in names)


def _known(name: str) -> str:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports(module: str):
    """(imported module, line, inside a function, marked lazy) for each of ``module``'s imports of zerokit."""
    path = MODULES[module]
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]
        else:
            continue
        lazy = LAZY in lines[node.lineno - 1]
        for target in targets:
            target = _known(target)
            if not target.startswith("zerokit") or target == module:
                continue
            yield target, node.lineno, id(node) in inner, lazy
            parts = target.split(".")  # importing a.b.c runs a.b's __init__ first
            for k in range(2, len(parts)):
                ancestor = ".".join(parts[:k])
                if not (module + ".").startswith(ancestor + "."):
                    yield ancestor, node.lineno, id(node) in inner, lazy


EDGES = [(m, *edge) for m in MODULES for edge in imports(m)]


def test_every_module_has_a_floor():
    missing = sorted({part_of(m) for m in MODULES if not key(part_of(m))})
    assert not missing, f"place {missing} on a floor of FLOORS (tests/test_layers.py)"


def test_the_built_on_arrows_stay_within_a_floor_and_form_no_cycle():
    for a, b in BUILT_ON:
        assert floor(a) == floor(b), f"{a} -> {b} crosses floors: it needs no entry in BUILT_ON"
    seen, order = set(), []

    def visit(node, path):
        assert node not in path, f"BUILT_ON has a cycle: {' -> '.join(path + [node])}"
        if node not in seen:
            seen.add(node)
            for a, b in BUILT_ON:
                if a == node:
                    visit(b, path + [node])

    for a, _ in BUILT_ON:
        visit(a, [])


def test_imports_flow_down_the_floors():
    wrong = []
    for src, dst, line, _, _ in EDGES:
        a, b = key(part_of(src)), key(part_of(dst))
        if a == b or b == "zerokit" and dst != "zerokit":
            continue
        if floor(b) < floor(a) or (a, b) in BUILT_ON:
            continue
        wrong.append(f"{MODULES[src].relative_to(PACKAGE.parent)}:{line} imports {dst} ({a} -> {b})")
    assert not wrong, "imports against the layer contract:\n" + "\n".join(sorted(set(wrong)))


def cycles(edges) -> list:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    graph = {}
    for src, dst, *_ in edges:
        graph.setdefault(src, set()).add(dst)
    index, low, stack, on_stack, groups, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_cycle_between_modules_counting_imports_inside_functions():
    found = cycles([e for e in EDGES if e[1] != "zerokit"])  # the package's face is imported before anything
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(group) for group in found)


def test_imports_inside_functions_are_there_to_keep_import_zerokit_light():
    unmarked = sorted({f"{MODULES[src].relative_to(PACKAGE.parent)}:{line} imports {dst}"
                       for src, dst, line, inside, lazy in EDGES if inside and not lazy
                       and str(MODULES[src].relative_to(PACKAGE.parent)) not in NOT_YET_AT_THE_TOP})
    assert not unmarked, ("imports inside functions: move each to the top of its file, or mark it "
                          f"'{LAZY}: why' when it keeps `import zerokit` light:\n" + "\n".join(unmarked))


LOADED_WHEN_USED = ["zerokit.course", "zerokit.grade", "zerokit.planner", "zerokit.bench", "zerokit.tour", "matplotlib"]


def test_import_zerokit_stays_light():
    code = ("import sys, zerokit; print(' '.join(m for m in %r if m in sys.modules))" % LOADED_WHEN_USED)
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == [], f"`import zerokit` loaded {loaded}; they load when used"


@pytest.mark.parametrize("name", ["plan", "grade"])
def test_the_lazy_names_still_answer(name):
    code = f"import zerokit; print(callable(zerokit.{name}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
