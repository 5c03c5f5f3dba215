"""A module that ends the interpreter while it imports."""

import sys

sys.exit(3)
DETECTOR = None
