"""Tensor parallelism: process groups, sharded layers, the worker ranks and their step channel."""
