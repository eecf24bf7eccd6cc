"""One package per real system, plus sim/, the trace-driven region simulator."""
