"""The package version (a base module: the dump writer records it without importing the facade)."""
__version__ = "0.1.0"
