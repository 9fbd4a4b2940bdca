"""A workload with odd layer sizes, for `zerokit compare --model tests/data/odd_workload.py:workload`."""
import zerokit


def workload():
    return zerokit.mlp((13, 37, 29, 7), batch_size=12, seed=3)
