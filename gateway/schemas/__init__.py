"""The request bodies of every endpoint, one module per router (pydantic models, nothing else; `images.py`
and `text_input.py` are field types they share): what a client may send. Wrong types and the static
bounds stated here are a 400 in the gateway's error shape (gateway/errors.py); the checks that need
settings or a model are made by the code the routers call (a 404 or 409 for what depends on state)."""
