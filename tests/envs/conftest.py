"""Every environment test leaves no worker behind: the process-wide environment pool is closed
after each module (tests/reliability checks that only the verifiers' workers are alive)."""
import pytest

from rljax.envs import runner


@pytest.fixture(autouse=True, scope="module")
def _close_env_pool():
  yield
  runner.close_env_pool()
