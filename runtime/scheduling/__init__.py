"""Scheduling: which requests run in a step (policy, preemption, DP attention's dispatch)."""
