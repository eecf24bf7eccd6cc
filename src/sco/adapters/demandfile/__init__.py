"""Demand intake from a YAML file: constant or time-series demand per partition."""
