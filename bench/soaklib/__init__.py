"""The parts of bench/soak.py: what it watches (`watch`) and the run itself, its
events, phases and results (`run`). They live in a folder because every file
directly in bench/ is a program that tests/test_benches.py runs."""
