"""The package version, apart from the package itself so that no module needs to import the package."""

__version__ = "0.1.0"
