import sys

from glassgpt.cli import main

sys.exit(main())
