"""The request bodies of every endpoint, one module per router (pydantic models, nothing else): what a
client may send. Wrong types are a 400 in the gateway's error shape (gateway/errors.py); the checks that
need settings or a model are made by the code the routers call."""
