"""The process runtime: what `make triton`, `make cluster`, the images and deploy/ start and keep running.

`python -m launcher` is `make triton` (stack.py: Triton, its supervisor and the gateway);
`python -m launcher.cluster` is `make cluster` and `make cluster-rolling`. Every process here is kept
running by one keeper (keeper.py)."""
