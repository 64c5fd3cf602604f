"""What every contract shares: naming the component under test and loading it like the engine does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import pytest

from kvserve.errors import PluginError
from kvserve.plugins import load_component
from kvserve.testing.contracts import CONTRACTS

DEFAULT_SEEDS = 4
"""Random cases per property-style test unless ``--kvserve-seeds`` says otherwise."""


class ComponentContract:
    """Base of the contract classes: subclasses set :attr:`kind`, plugin tests set the name.

    The component is loaded through the plugin registry (``kvserve.plugins.load_component``),
    exactly as the engine selects it, so a contract test also checks that the plugin is
    installed and registered under the name users will type.
    """

    kind: ClassVar[str]
    """Plugin kind, a key of ``kvserve.plugins.KINDS``."""

    pytestmark = [pytest.mark.kvserve_contract]

    @classmethod
    def component_name(cls) -> str:
        """The registry name the plugin's test class set (e.g. ``backend = "cpu"``)."""
        attribute = CONTRACTS[cls.kind].name_attribute
        name = getattr(cls, attribute, None)
        if not isinstance(name, str) or not name:
            pytest.fail(
                f"{cls.__name__} must name the {cls.kind.replace('_', ' ')} under test: "
                f"set the class attribute {attribute} = '<registry name>'",
                pytrace=False,
            )
        return name

    @classmethod
    def load_component(cls) -> Any:
        """The class under test. Override only to test a class that is not registered
        (a core built-in the engine constructs directly, or a deliberately broken variant)."""
        return load_component(cls.kind, cls.component_name())

    @pytest.fixture(scope="class")
    @classmethod
    def component(cls) -> Any:
        """The loaded component class; a plugin that cannot be loaded fails with the registry's reason."""
        try:
            return cls.load_component()
        except PluginError as exc:
            pytest.fail(f"cannot load {cls.kind.replace('_', ' ')} {cls.component_name()!r}: {exc}", pytrace=False)


def num_seeds(config: pytest.Config) -> int:
    """How many random cases a property-style test generates (``--kvserve-seeds``)."""
    return int(config.getoption("kvserve_seeds", default=None) or DEFAULT_SEEDS)


def violation(message: str) -> None:
    """Fail the running test with a contract violation (no traceback into the test kit)."""
    pytest.fail(message, pytrace=False)


@contextmanager
def default_dtype(dtype: Any) -> Iterator[None]:
    """Build modules as the engine does: with the model dtype as torch's default dtype."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextmanager
def reported_as(what: str) -> Iterator[None]:
    """Turn a driver's AssertionError into a contract failure that names ``what`` broke it."""
    try:
        yield
    except AssertionError as exc:
        failure = exc
    else:
        return
    violation(f"{what} broke its contract: {failure}")  # outside the except: no chained traceback
