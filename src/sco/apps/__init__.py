"""Entry points: the command line (and later the distributor and the node agent)."""
