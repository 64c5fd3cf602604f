"""An optional third-party library a plugin runs on, and the sentence saying why it cannot be used."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata


@dataclass(frozen=True)
class OptionalLibrary:
    """A library a plugin needs only when it runs (a GPU kernel package, say), checked from its
    installed distribution's metadata, so that asking never imports it.

    A plugin passes :meth:`missing_reason` as ``unavailable`` when it registers (``kvserve plugins``
    shows it) and adds it to its refusals (``unsupported_reasons``), so both say the same sentence.
    """

    distribution: str
    """The distribution whose metadata holds the version, e.g. ``"flashinfer-python"``."""
    name: str
    """How reasons call the library, e.g. ``"flashinfer"``."""
    minimum: tuple[int, int]
    """The oldest supported ``(major, minor)``."""
    below: tuple[int, int]
    """The first unsupported ``(major, minor)`` above the supported range."""
    install: str
    """The command that installs a supported version, e.g. ``"pip install kvserve-attention-flashinfer[gpu]"``."""

    @property
    def supported(self) -> str:
        """The supported range as a version specifier, e.g. ``">=0.2.0,<0.8.0"``."""
        return f">={self.minimum[0]}.{self.minimum[1]}.0,<{self.below[0]}.{self.below[1]}.0"

    def missing_reason(self) -> str | None:
        """Why the library cannot be used (not installed, or a version outside :attr:`supported`,
        judged by its major and minor number); None if it can."""
        try:
            version = metadata.version(self.distribution)
        except metadata.PackageNotFoundError:
            return f"{self.name} is not installed ({self.install})"
        match = re.match(r"(\d+)\.(\d+)", version)
        if match is None or not self.minimum <= (int(match[1]), int(match[2])) < self.below:
            return (
                f"{self.distribution} {version} is installed, but this backend needs "
                f"{self.distribution}{self.supported} ({self.install})"
            )
        return None
