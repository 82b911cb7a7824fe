"""How many examples a property runs, relative to the loaded Hypothesis profile.

``tests/conftest.py`` loads the profile (``HYPOTHESIS_PROFILE``: ``ci`` by default, ``dev``,
``thorough``) before any test module is imported, so ``examples(k)`` read at decoration time
is ``k`` times that profile's ``max_examples``. A property pins no absolute count: one that is
cheap per example and searches a large space asks for a multiple, and every count still grows
and shrinks with the profile.
"""

from __future__ import annotations

from hypothesis import settings


def examples(times: float) -> int:
    """``times`` the profile's ``max_examples``, at least one."""
    return max(1, round(settings.default.max_examples * times))
