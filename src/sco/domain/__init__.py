"""Pure types and rules. Imports nothing of ours and does no I/O."""
