import sys

from jaxcoll.cli import main

sys.exit(main())
