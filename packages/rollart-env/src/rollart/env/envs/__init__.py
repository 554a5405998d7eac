"""Shipped environments: FrozenLake, multi-turn math with a calculator, a code sandbox, a latency wrapper."""
