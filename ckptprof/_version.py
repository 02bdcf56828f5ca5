"""The package's version, in a module of its own: the tracing layer names its
instrumentation scope with it without importing the package root (which imports
the tracing layer)."""

__version__ = "0.1.0"
