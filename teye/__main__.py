"""`python -m teye ...`: the same as the `teye` command."""
import sys

from teye import main

sys.exit(main())
