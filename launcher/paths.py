"""Where the repository's parts are, for the processes this package starts."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = ROOT / "model_repository"
BACKENDS = ROOT / "backends"
