"""The imperative shell: controllers, runners, and what they need at run time."""
