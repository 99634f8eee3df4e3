"""`python -m radixlang ...`: the same command line as the `radixlang` script."""
import sys

from radixlang.server.cli import main

sys.exit(main())
