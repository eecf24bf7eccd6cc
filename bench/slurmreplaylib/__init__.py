"""The parts of bench/slurm_replay.py: what it asks Slurm (`slurmside`) and does to
Nova and Placement (`nova`). They live in a folder because every file directly in
bench/ is a program that tests/test_benches.py runs."""
