"""What the gateway serves about itself besides the API: /docs and /redoc from local assets (docs.py), the
OpenAPI document completed from the route policy (openapi.py), and the /ui browser page (ui.py, ui_static/)."""
