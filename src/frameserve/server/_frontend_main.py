"""``python -m frameserve.server._frontend_main SOCKET_FD MEMORY_FD``: a front-end process
(:func:`frameserve.server._frontend.main`). A module of its own, which nothing imports, so that
running it as ``__main__`` never finds it imported already."""

import sys

from frameserve.server._frontend import main

if __name__ == "__main__":
    sys.exit(main())
