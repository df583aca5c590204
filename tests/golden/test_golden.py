"""Refactors are bit-identical: every golden case's dump hashes as recorded (see golden.py)."""
from __future__ import annotations

import pytest

from golden import CASES, case_digests, load


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_digests(case):
    recorded = load()[case]
    now = case_digests(case)
    assert sorted(now) == sorted(recorded), f"{case}: the set of dumped ops changed"
    changed = [name for name in now if now[name] != recorded[name]]
    assert not changed, f"{case}: {len(changed)} op output(s) changed bits, first: {changed[0]}"
