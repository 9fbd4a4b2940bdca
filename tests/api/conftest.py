"""The launches the contract tests share: one per world size carries the checks of every ``test_*_contract.py``
here (a launch costs more than the checks), once per session (per worker under xdist)."""
import pytest

import zerokit
from api_contracts import _contracts, _more, _three


@pytest.fixture(scope="session")
def on_two_ranks():
    return zerokit.launch(_contracts, 2)


@pytest.fixture(scope="session")
def more_on_two_ranks():
    return zerokit.launch(_more, 2)


@pytest.fixture(scope="session")
def on_three_ranks():
    return zerokit.launch(_three, 3)
