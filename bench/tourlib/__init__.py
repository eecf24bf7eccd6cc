"""The parts of bench/tour.py: the reader's shell and what it can read of the lab's
world (`lab`: Nova, fleet state, Slurm, the Kubernetes stand-in, /metrics, the log),
and the checks of the steps whose promises need that world to be read (`promises`).
They live in a folder because every file directly in bench/ is a program that
tests/test_benches.py runs."""
