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
    interface: ClassVar[type]
    """The class every component of the kind subclasses."""
    named: ClassVar[bool] = True
    """Whether the component's ``name`` attribute must be its registry name (models have none)."""

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

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize ``seed`` (property-style tests) with ``--kvserve-seeds`` random cases."""
        if "seed" in metafunc.fixturenames:
            metafunc.parametrize("seed", range(num_seeds(metafunc.config)))

    @pytest.fixture(scope="class")
    @classmethod
    def component(cls) -> Any:
        """The loaded component class; a plugin that cannot be loaded fails with the registry's reason."""
        try:
            return cls.load_component()
        except PluginError as exc:
            pytest.fail(f"cannot load {cls.kind.replace('_', ' ')} {cls.component_name()!r}: {exc}", pytrace=False)

    def test_registered_class_implements_the_interface(self, component):
        """The registry name loads a subclass of the kind's interface (named by that registry name)."""
        assert isinstance(component, type) and issubclass(component, self.interface), (
            f"{component!r} is not a subclass of {self.interface.__module__}.{self.interface.__qualname__}"
        )
        if self.named:
            assert getattr(component, "name", None) == self.component_name(), (
                f"{component.__name__}.name is {getattr(component, 'name', None)!r}, "
                f"but it is registered as {self.component_name()!r}"
            )


def num_seeds(config: pytest.Config) -> int:
    """How many random cases a property-style test generates (``--kvserve-seeds``)."""
    return int(config.getoption("kvserve_seeds", default=None) or DEFAULT_SEEDS)


def violation(message: str) -> None:
    """Fail the running test with a contract violation (no traceback into the test kit)."""
    pytest.fail(message, pytrace=False)


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
