"""The package's version: a leaf that every module may import (it imports nothing).

Modules that record the version (checkpoints, shards, run metadata, ``--version``) import it
from here, never from the package root, so that the root stays the top of the import graph.
"""

__version__ = "0.1.0"
