"""The package's version, in a module of its own: the package's modules read it here, not from ``commitenv``
(whose ``__init__`` reaches most of them, which would close an import cycle)."""

__version__ = "0.1.0"
