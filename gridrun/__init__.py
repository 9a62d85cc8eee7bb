"""gridrun: a terminal experiment runner for PyTorch."""

__version__ = "0.1.0"
