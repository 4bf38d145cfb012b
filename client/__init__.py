"""What a user runs: gRPC and HTTP clients for every pipeline (`python -m client.<name>` or `python client/<name>.py`)."""
