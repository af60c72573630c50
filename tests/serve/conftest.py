"""The real vLLM both serving and capture tests run: the pinned venv (built once), or a skip outside CI."""

import os

import pytest

from eaglewire.infra.errors import EaglewireError


@pytest.fixture(scope="session")
def vllm_python():
    from eaglewire.serve.vllm_env import find_python

    try:
        return find_python()
    except EaglewireError as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"vLLM is required under CI=true: {e}")
        pytest.skip(f"no vLLM: {e}")
