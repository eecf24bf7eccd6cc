"""The trace-driven region simulator: a first-class provider on a virtual clock."""
