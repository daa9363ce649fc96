"""headlab's version, on the lowest floor: pages and outputs stamp it."""

__version__ = "0.1.0"
