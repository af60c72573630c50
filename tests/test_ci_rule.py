"""The CI rule of src/eaglewire_testing/ci.py: a test that cannot run skips locally and fails under CI=true."""

import pytest
from _pytest.outcomes import Failed, Skipped

from eaglewire_testing.ci import cannot_run


@pytest.mark.parametrize("value,outcome", [("true", Failed), ("1", Failed), ("", Skipped), ("false", Skipped)])
def test_cannot_run_fails_only_under_ci(monkeypatch, value, outcome):
    monkeypatch.setenv("CI", value)
    with pytest.raises(outcome, match="chromium is missing"):
        cannot_run("chromium is missing")
