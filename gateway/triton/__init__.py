"""The Triton client side: the gRPC engine every call goes through (engine.py), requests sharing calls
while every slot is busy (coalesce.py), and the watch that notices a dead or restarted server and loads
the gateway's models again (server_watch.py)."""
