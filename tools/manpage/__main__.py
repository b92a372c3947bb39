import sys

from tools.manpage import main

sys.exit(main())
