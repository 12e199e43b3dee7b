"""The sandbox refuses each escape: every test runs a program that does what untrusted code
might (open a socket to a server this test started, allocate 10 GB, fork past the process
limit, leave a process behind in a session of its own, write outside its directory, print
without end, spin, write a huge file, sleep) and checks the outcome that only the limit explains:
without the limit each program would succeed (the server would accept, the file would exist on
the host, the process would survive, ...). The namespaces mode needs root and a kernel that
allows ``unshare`` (this machine: checked by the first test, so a host without it fails loudly
instead of testing the weaker mode under the stronger one's name)."""
import os
import socket
import threading
import uuid

import pytest

from rljax.agents import sandbox
from rljax.agents.sandbox import Limits, run_python

def test_the_namespaces_mode_is_available_here():
  assert sandbox.isolation_mode() == "namespaces"
  run = run_python("import os; print(os.getuid(), os.getcwd())")
  assert run.ok and run.isolation == "namespaces"
  uid, cwd = run.stdout.split()
  assert int(uid) >= sandbox.UID_BASE and cwd == "/tmp/work"


@pytest.fixture
def server():
  """A TCP server on the host's loopback that counts the connections it accepts."""
  s = socket.socket()
  s.bind(("127.0.0.1", 0))
  s.listen(8)
  accepted = []

  def serve():
    try:
      while True:
        accepted.append(s.accept()[0])
    except OSError:
      return
  threading.Thread(target=serve, daemon=True).start()
  yield s.getsockname()[1], accepted
  s.close()


@pytest.mark.parametrize("mode", ["namespaces", "policy"])
def test_no_network(server, mode):
  port, accepted = server
  reach = ("import socket\n"
           f"s = socket.create_connection(('127.0.0.1', {port}), timeout=5)\nprint('connected')")
  assert socket.create_connection(("127.0.0.1", port), timeout=5)  # the server does accept
  run = run_python(reach, mode=mode)
  assert run.status == "exit" and "connected" not in run.stdout
  assert ("Network is unreachable" if mode == "namespaces" else "refused by the sandbox's policy") \
      in run.detail
  assert len(accepted) == 1  # the test's own connection only


def test_ten_gigabytes_are_refused():
  run = run_python("x = bytearray(10 * 2**30)\nprint('allocated')", Limits(memory_mb=512))
  assert run.status == "exit" and run.detail.endswith("MemoryError")
  assert "allocated" not in run.stdout


def _live(uid: int):
  return [pid for pid, _, zombie in sandbox._user_processes(uid) if not zombie]


def test_forks_stop_at_the_process_limit_and_none_is_left():
  code = ("import os, time\nprint(os.getuid(), flush=True)\nfor i in range(40):\n"
          "  if os.fork() == 0:\n    time.sleep(300)\n    os._exit(0)\n  print('child', i, flush=True)")
  run = run_python(code, Limits(processes=8))
  assert run.status == "exit" and "BlockingIOError" in run.detail
  lines = run.stdout.split()
  assert 0 < lines.count("child") < 8  # the limit counts the program itself
  assert _live(int(lines[0])) == []


def test_a_process_in_a_session_of_its_own_does_not_survive():
  code = ("import os, time\nprint(os.getuid(), flush=True)\nif os.fork() == 0:\n"
          "  os.setsid()\n  time.sleep(300)\n  os._exit(0)\nprint('parent done')")
  run = run_python(code)
  assert run.ok and "parent done" in run.stdout
  assert _live(int(run.stdout.split()[0])) == []


def test_writes_outside_its_directory_do_not_reach_the_host():
  """The host's /tmp (world-writable) is another tmpfs in there; the package's directory (the
  host's disk, writable by root) is not the program's to write."""
  name = f"/tmp/rljax-escape-{uuid.uuid4().hex}"
  target = os.path.join(os.path.dirname(sandbox.__file__), f"escape-{uuid.uuid4().hex}")
  code = (f"open({name!r}, 'w').write('x')\nprint(open({name!r}).read(), flush=True)\n"
          f"open('here.txt', 'w').write('ok')\nopen({target!r}, 'w').write('x')")
  run = run_python(code)
  assert run.stdout.strip() == "x"  # its own /tmp, private
  assert run.status == "exit" and "PermissionError" in run.detail
  assert not os.path.exists(name) and not os.path.exists(target)


def test_endless_output_is_cut_and_the_program_killed():
  run = run_python("import sys\nwhile True:\n  sys.stdout.write('x' * 65536)",
                   Limits(output_bytes=4096, wall_s=60))
  assert run.status == "output" and len(run.stdout) == 4096 and run.wall_s < 30


def test_cpu_time_is_bounded():
  run = run_python("while True:\n  pass", Limits(cpu_s=1, wall_s=60))
  assert run.status == "cpu" and run.wall_s < 30


def test_wall_clock_is_bounded():
  run = run_python("import time\ntime.sleep(300)", Limits(wall_s=1))
  assert run.status == "timeout" and run.wall_s < 30


def test_file_size_is_bounded():
  run = run_python("open('big', 'wb').write(b'x' * (8 * 2**20))", Limits(file_mb=1))
  assert run.status == "exit" and "File too large" in run.detail


def test_a_policy_run_leaves_no_directory():
  before = {d for d in os.listdir("/tmp") if d.startswith("rljax-sandbox-")}
  run = run_python("open('f', 'w').write('x')\nimport os\nprint(os.getcwd())", mode="policy")
  assert run.ok and not os.path.exists(run.stdout.strip())
  assert {d for d in os.listdir("/tmp") if d.startswith("rljax-sandbox-")} == before
