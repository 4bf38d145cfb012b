"""The HTTP server process around the app (`python -m gateway`): uvicorn with the connection bounds it
lacks (http_protocol.py), the client's address from a trusted proxy's PROXY protocol v2 header
(proxy_protocol.py) and a drain on SIGTERM (draining.py)."""
