"""`make triton`: `python -m launcher [--no-gateway] [-- extra tritonserver arguments]` (launcher/stack.py)."""
import sys

from launcher.stack import main

if __name__ == "__main__":
    sys.exit(main())
