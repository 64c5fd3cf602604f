"""The pytest plugin of ``kvserve.testing`` (entry point ``pytest11: kvserve``).

Loaded by every pytest run in an environment with kvserve-core installed, so it stays
light: it imports neither torch nor the contracts, only registers

- the ``kvserve_contract`` marker (every contract test carries it: ``pytest -m kvserve_contract``),
- the ``--kvserve-seeds N`` option: random cases per property-style contract test,
- the ``paged_sequences`` fixture: :class:`kvserve.testing.paged_model.PagedSequences`,
  which runs a model over the paged KV cache the way the engine's runner does.

Disable it with ``-p no:kvserve``.
"""

from __future__ import annotations

import pytest

# Contract checks use plain asserts; rewriting them gives pytest's detailed failure diffs.
pytest.register_assert_rewrite("kvserve.testing.contracts", "kvserve.testing.scheduler_driver")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvserve", "kvserve plugin contracts")
    group.addoption(
        "--kvserve-seeds",
        type=int,
        default=None,
        metavar="N",
        help="random workloads/cases per property-style kvserve contract test (default 4)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kvserve_contract: a check of a kvserve plugin contract (kvserve.testing contract suites)"
    )


@pytest.fixture
def paged_sequences():
    """The :class:`~kvserve.testing.paged_model.PagedSequences` class, to drive a model over the paged cache."""
    from kvserve.testing.paged_model import PagedSequences

    return PagedSequences
