"""Triton's ``triton_python_backend_utils`` under frameserve's name: the same module as
:mod:`frameserve.backends.python.pb_utils` (``import frameserve.pb_utils`` gives that module
itself, so its names, classes and state are one and the same). A ``model.py`` imports it as
``import triton_python_backend_utils as pb_utils`` while the ``python`` backend runs it.
"""

from __future__ import annotations

import sys

from frameserve.backends.python import pb_utils as _module

sys.modules[__name__] = _module
