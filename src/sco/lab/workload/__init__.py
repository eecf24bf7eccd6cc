"""Workloads replayed on sco's capacity: batch jobs in a queue, as their users see them."""
