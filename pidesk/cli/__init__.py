"""The ``pidesk`` command: the composition root that wires concrete parts together."""
