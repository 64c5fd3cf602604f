"""OptionalLibrary says whether a distribution is installed in a supported version, from its metadata."""

from importlib import metadata

import pytest

from kvserve.optional_library import OptionalLibrary

PLUGGY = tuple(int(part) for part in metadata.version("pluggy").split(".")[:2])


def library(**changes) -> OptionalLibrary:
    fields = dict(
        distribution="pluggy", name="pluggy", minimum=PLUGGY, below=(PLUGGY[0] + 1, 0), install="pip install x"
    )
    return OptionalLibrary(**(fields | changes))


def test_an_installed_supported_version_has_no_reason():
    assert library().missing_reason() is None


def test_a_missing_distribution_says_how_to_install_it():
    lib = library(distribution="kvserve-no-such-dist", name="nosuch", install="pip install kvserve-x[gpu]")
    assert lib.missing_reason() == "nosuch is not installed (pip install kvserve-x[gpu])"


@pytest.mark.parametrize("bounds", [dict(below=PLUGGY), dict(minimum=(PLUGGY[0] + 1, 0), below=(PLUGGY[0] + 2, 0))])
def test_a_version_outside_the_range_names_it_and_the_range(bounds):
    lib = library(**bounds)
    version = metadata.version("pluggy")
    assert (
        lib.missing_reason()
        == f"pluggy {version} is installed, but this backend needs pluggy{lib.supported} (pip install x)"
    )


def test_supported_is_a_version_specifier():
    assert library(minimum=(2, 6), below=(3, 0)).supported == ">=2.6.0,<3.0.0"
