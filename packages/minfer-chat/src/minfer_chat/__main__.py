"""`python -m minfer_chat`: the same as the `minfer-chat` command."""

import sys

from minfer_chat.cli import main

sys.exit(main())
