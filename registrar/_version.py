"""The package's version, in a module of its own: protocols and surfaces read it from here, not
from the package root (which imports them)."""

__version__ = "0.2.0"
