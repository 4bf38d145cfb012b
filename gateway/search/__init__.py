"""Image search collections: vector stores (Faiss embedded, Qdrant local or remote) behind one
interface, and the collections service that keeps their metadata durable under DATA_DIR."""
from gateway.search.stores import Hit, VectorStore

__all__ = ["Hit", "VectorStore"]
