import sys

from gpumm.cli import main

sys.exit(main())
