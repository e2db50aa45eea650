"""A Ctrl-C during an import waits for the outermost import to finish (`interrupts._whole_import`).

torch's C++ initialisers (``_c10d_init``, ``_multiprocessing_init``, ``_dist_autograd_init``)
import Python modules from functions that cannot pass an exception on: a `KeyboardInterrupt`
raised in one of those imports aborted the command (``terminate called after throwing an instance of
'python_error'``, exit status 134), which a loaded CI machine hit once in a hundred runs of
`test_ctrl_c_at_any_moment`. These tests deliver the interrupt at exactly such a moment, so
that they fail without the whole imports on every run, not by chance.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from resstream import interrupts

#: A child that runs `python -m resstream ARGS` and sends itself SIGINT in the K-th Python
#: function called while the C function CALLER runs (an importlib step of one of its imports);
#: it writes FLAG just before it sends it.
INJECT = textwrap.dedent(
    """
    import os, runpy, signal, sys
    caller, k, flag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    calling, calls = [], [0]

    def profile(frame, event, arg):
        if event == "c_call":
            calling.append(getattr(arg, "__name__", ""))
        elif event in ("c_return", "c_exception"):
            if calling:
                calling.pop()
        elif event == "call" and caller in calling:
            calls[0] += 1
            if calls[0] == k:
                sys.setprofile(None)
                open(flag, "w").close()
                os.kill(os.getpid(), signal.SIGINT)

    sys.argv = ["resstream", *sys.argv[4:]]
    sys.setprofile(profile)
    runpy.run_module("resstream", run_name="__main__")
    """
)

INTERRUPTED = "resstream: error: interrupted; nothing half-written was kept"
SIMULATE = ["simulate", "--layers", "2", "--tokens", "5", "--dim", "4", "--sims", "20", "--quiet"]


def _child(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


@pytest.mark.parametrize(("initialiser", "call"), [("_c10d_init", 3), ("_multiprocessing_init", 1)])
def test_ctrl_c_inside_an_import_by_torchs_cpp_initialisers_exits_130(tmp_path, initialiser, call):
    """Exit status 134 (abort) before imports were whole, at every call tried (1 to 10)."""
    flag, out = tmp_path / "sent", tmp_path / "out"
    done = _child("-c", INJECT, initialiser, str(call), str(flag), *SIMULATE, "--out", str(out))
    if not flag.exists():
        pytest.skip(f"torch {initialiser} imports no Python module in this version: nothing to interrupt")
    assert (done.returncode, done.stderr.strip()) == (130, INTERRUPTED)
    assert not out.exists()


#: A child that imports `interrupted_module` (the remembering handler installed unless told
#: not to) and says whether the `KeyboardInterrupt` came after its body ran to the end.
IMPORT_INTERRUPTED = textwrap.dedent(
    """
    import sys
    from resstream.interrupts import remember_interrupts
    if sys.argv[1] == "remember":
        remember_interrupts()
    try:
        import interrupted_module
    except KeyboardInterrupt:
        module = sys.modules.get("interrupted_module")
        print("whole" if getattr(module, "FINISHED", False) else "half")
    """
)
SIGINT_SELF = "os.kill(os.getpid(), signal.SIGINT)\n"
SPIN = "for _ in range(10_000):\n    pass\n"


def _interrupted_import(tmp_path: Path, body: str, handler: str = "remember") -> str:
    """ "whole" or "half": where the interrupts that `body` sends itself while imported land."""
    (tmp_path / "interrupted_module.py").write_text("import os, signal\n" + body + "FINISHED = True\n")
    done = _child("-c", IMPORT_INTERRUPTED, handler, cwd=tmp_path)
    return done.stdout.strip() or done.stderr


def test_an_interrupt_during_an_import_is_raised_at_the_import_statement_after_it(tmp_path):
    assert _interrupted_import(tmp_path, SIGINT_SELF + SPIN) == "whole"
    # Before remember_interrupts, Python's own handler raises inside the module body.
    assert _interrupted_import(tmp_path, SIGINT_SELF + SPIN, handler="python") == "half"


def test_a_second_interrupt_during_an_import_interrupts_at_once(tmp_path):
    """For an import that hangs: the second Ctrl-C does not wait for it."""
    assert _interrupted_import(tmp_path, SIGINT_SELF + SPIN + SIGINT_SELF + SPIN) == "half"


def test_a_child_forked_during_an_import_is_not_inside_it(tmp_path):
    (tmp_path / "forking_module.py").write_text(
        "import os\nfrom resstream import interrupts\npid = os.fork()\n"
        "if pid == 0:\n    os._exit(3 if interrupts._state['importing'] else 0)\n"
        "CHILD = os.waitpid(pid, 0)[1] >> 8\n"
    )
    script = "from resstream.interrupts import remember_interrupts\nremember_interrupts()\n"
    done = _child("-c", script + "import forking_module\nprint(forking_module.CHILD)\n", cwd=tmp_path)
    assert done.stdout.strip() == "0", done.stderr


@pytest.mark.usefixtures("default_signal_handlers")
def test_a_failed_import_leaves_no_import_under_way():
    with pytest.raises(ModuleNotFoundError):
        interrupts._whole_import("resstream_no_such_module")
    assert interrupts._state["importing"] is False
    assert interrupts._whole_import("json").__name__ == "json"
    assert interrupts._state["importing"] is False
