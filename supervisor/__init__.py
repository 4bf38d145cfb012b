"""Supervision of the Triton server's Python stubs: detect a dead or hung stub and bring its model back."""
