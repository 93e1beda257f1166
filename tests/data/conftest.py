"""Real projects kept as test data (tests/test_real_checks.py): their own tests are not ours."""

from __future__ import annotations

collect_ignore_glob = ["*"]
